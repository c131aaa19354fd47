"""The task definitions the SDK reads (options, defaults, outputs): the contracts bundled into the SDK's own package
when it is installed alone (clients/hatch_build.py writes them from tasks/), else the repository's ``tasks`` package.

Relative first: an installed SDK must not pick up some other top-level ``tasks`` of the user's environment.
"""

try:
    from .tasks.definition import TEXT_INPUT, Option, Task, get, registry
except ImportError:
    from tasks.definition import TEXT_INPUT, Option, Task, get, registry

__all__ = ["TEXT_INPUT", "Option", "Task", "get", "registry"]
