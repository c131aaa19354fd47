"""Check a model repository before starting Triton, so a missing ``model.onnx`` is one clear sentence.

Triton itself would start, fail to load the model and bury the reason in its log. Building the repository
(exporting the ONNX files) is another step's job; this only says what is missing and where. Configs are read
with Triton's own ``ModelConfig`` message, so a config Triton would refuse is refused here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

DEFAULT_FILENAMES = {"onnxruntime": "model.onnx", "python": "model.py"}
PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime"}


class RepositoryError(ValueError):
    """The model repository cannot be served as it stands."""


@dataclass(frozen=True)
class ModelDir:
    """One model directory and the config Triton will use for it (``configs/<name>.pbtxt`` first)."""

    path: Path
    config: Path | None

    @property
    def name(self) -> str:
        return self.path.name

    def read_config(self) -> model_config_pb2.ModelConfig:
        """The parsed config; :class:`RepositoryError` names the file and the parse error."""
        if self.config is None:
            return model_config_pb2.ModelConfig()
        try:
            return text_format.Parse(self.config.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
        except (text_format.ParseError, UnicodeDecodeError) as err:
            raise RepositoryError(f"model '{self.name}': {self.config} does not parse: {err}") from None

    def expected_file(self) -> str | None:
        """The file each version directory must hold, for the backends we know."""
        config = self.read_config()
        backend = config.backend or PLATFORM_BACKENDS.get(config.platform, "")
        return config.default_model_filename or DEFAULT_FILENAMES.get(backend)

    def latest_version(self) -> Path | None:
        versions = [p for p in self.path.iterdir() if p.is_dir() and p.name.isdigit()]
        return max(versions, key=lambda p: int(p.name)) if versions else None


def model_dirs(repository: Path, config_name: str | None = None) -> list[ModelDir]:
    """Every sub-directory, as Triton sees them (it treats each one as a model)."""
    dirs = []
    for path in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        candidates = [path / "configs" / f"{config_name}.pbtxt"] if config_name else []
        candidates.append(path / "config.pbtxt")
        dirs.append(ModelDir(path, next((c for c in candidates if c.is_file()), None)))
    return dirs


def find_problems(repository: Path, models: Sequence[str] | None = None, config_name: str | None = None) -> list[str]:
    """Sentences naming each thing that keeps the repository (or the listed ``models``) from loading."""
    if not repository.is_dir():
        return [f"model repository {repository} does not exist (build it first)"]
    found = {d.name: d for d in model_dirs(repository, config_name)}
    if models is None:
        if not found:
            return [f"model repository {repository} holds no models"]
        selected = list(found.values())
    else:
        missing = [m for m in models if m not in found]
        if missing:
            available = ", ".join(found) or "none"
            return [f"model(s) {', '.join(missing)} not found in {repository} (it has: {available})"]
        selected = [found[m] for m in models]

    problems = []
    for model in selected:
        if model.config is None:
            problems.append(f"model '{model.name}': no config.pbtxt in {model.path}")
            continue
        try:
            expected = model.expected_file()
        except RepositoryError as err:
            problems.append(str(err))
            continue
        version = model.latest_version()
        if version is None:
            problems.append(f"model '{model.name}': no version directory (e.g. {model.path / '1'})")
            continue
        if expected and not (version / expected).exists():
            problems.append(f"model '{model.name}': {version / expected} is missing")
    return problems


def require_servable(repository: Path, models: Sequence[str] | None = None, config_name: str | None = None) -> None:
    """Raise :class:`RepositoryError` listing every problem, or return quietly."""
    problems = find_problems(repository, models, config_name)
    if problems:
        raise RepositoryError("cannot serve the model repository:\n  " + "\n  ".join(problems))
