"""The tasks the server offers, each defined once in ``tasks/<name>.toml`` (see :mod:`tasks.definition`).

    from tasks import registry
    registry()["translate"].option("num_beams").high   # -> 8

`python -m tasks` lists them, writes the Triton configs they generate, and checks the committed configs.
"""

from .definition import (
    PATH_VARIABLE,
    TEXT_INPUT,
    DefinitionError,
    Endpoint,
    LoadTexts,
    OnnxModel,
    Option,
    Task,
    Tensor,
    get,
    load,
    registry,
)

__all__ = [
    "PATH_VARIABLE",
    "TEXT_INPUT",
    "DefinitionError",
    "Endpoint",
    "LoadTexts",
    "OnnxModel",
    "Option",
    "Task",
    "Tensor",
    "get",
    "load",
    "registry",
]
