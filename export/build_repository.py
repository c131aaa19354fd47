"""Build the Triton model repository from the task definitions and the committed checkpoints.

`python -m export.build_repository` fills each task's models (``tasks/<name>.toml``) into `model_repository/`: every
ONNX model is exported from the task's checkpoint by the function its ``export`` names (or copied from the ``file``
beside the definition), and each front model's version folder receives its ``model.py``
(serving/frontends/triton_model.py), the definition (``<task>.toml``), the assets it lists (tokenizers, config.json)
and, for a task defined outside this package, its task module. The Triton configs are generated separately (`python
-m tasks generate`; `make repository` runs both). A stamp file records what each task was built from, so an
unchanged task is not exported again (`--force` rebuilds).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tasks.definition import Task, registry

ROOT = Path(__file__).resolve().parents[1]
STAMP = ".built.json"
FRONT_MODEL_PY = ROOT / "serving" / "frontends" / "triton_model.py"  # every front model's model.py


EXPORTERS = sorted((ROOT / "export").rglob("*.py"))  # the code that writes the graphs, in every subpackage


def fingerprint(task: Task, source: Path) -> str:
    """What the built files depend on: the definition, the exporting code and every file of the checkpoint (or
    task) folder. A change to the exporters rebuilds every task: a graph the serving code no longer matches
    would fail at the first request, not at the build."""
    h = hashlib.sha256(task.source.read_bytes() + FRONT_MODEL_PY.read_bytes())
    for path in EXPORTERS:
        h.update(path.read_bytes())
    for path in sorted(source.rglob("*")):  # a checkpoint may hold another model's folder (summarize/extractor)
        if path.is_file() and path.name not in ("metrics.json", "README.md"):  # scores and model cards: not built
            h.update(str(path.relative_to(source)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


# -- exporters named by the definitions: (task, checkpoint folder, model.onnx to write) -> the file written ------


def encoder_classifier(task: Task, checkpoint: Path, destination: Path) -> Path:
    from export.graphs.onnx_export import export_encoder_classifier
    from export.training import sentiment

    model, _, _ = sentiment.load(checkpoint)
    return export_encoder_classifier(model, destination)


def seq2seq_generator(task: Task, checkpoint: Path, destination: Path) -> Path:
    """The BeamSearch generator, its length limit the top of the task's `max_new_tokens` range."""
    from export.graphs.seq2seq_export import export_generator
    from export.model.reference_search import ReferenceSearch
    from export.training import seq2seq

    model, config, _, _ = seq2seq.load(checkpoint)
    max_len = task.option("max_new_tokens").high + 1  # the start token counts
    return export_generator(model, destination, max_len=max_len, **asdict(ReferenceSearch.from_config(config)))


def span_scorer(task: Task, checkpoint: Path, destination: Path) -> Path:
    """The extractive summarizer's token scorer (export/training/extractive.py), from the checkpoint's extractor
    folder."""
    from export.graphs.onnx_export import export_encoder_classifier
    from export.training import extractive

    model, _, _ = extractive.load(checkpoint / extractive.EXTRACTOR_FOLDER)
    return export_encoder_classifier(model, destination, output="token_scores")


def step_graphs(task: Task, checkpoint: Path, folder: Path) -> list[Path]:
    """The continuous-batching engine's encoder.onnx and decoder.onnx, and their int8 twins that the front model
    runs with precision = "int8" (export/graphs/step_export.py)."""
    from export.graphs.step_export import export_step_graphs, quantize_step_graphs
    from export.training import seq2seq

    model, _, _, _ = seq2seq.load(checkpoint)
    return [*export_step_graphs(model, folder), *quantize_step_graphs(folder)]


def encoder_copy(task: Task, checkpoint: Path, folder: Path) -> list[Path]:
    """The endpoint's `encoder` model, copied beside its front model as encoder.onnx, which the front model runs
    in-process (serving/frontends/sentiment.py says why, and opens this name). Models are exported before the
    endpoints' graphs. The serving package stays out of this import: the image's export stage does not have it."""
    exported = folder.parent.parent / task.endpoint.models["encoder"].name / "1" / "model.onnx"
    return [Path(shutil.copy2(exported, folder / "encoder.onnx"))]


def imported_model(task: Task, checkpoint: Path, destination: Path) -> Path:
    """An ONNX model that an importer wrote (export/import_hf): ``<checkpoint>/<model name>.onnx``, copied as the
    model's model.onnx."""
    return Path(shutil.copy2(checkpoint / f"{destination.parent.parent.name}.onnx", destination))


def imported_graphs(task: Task, checkpoint: Path, folder: Path) -> list[Path]:
    """The graphs a front model runs itself that an importer wrote into the checkpoint folder (the engine's step
    graphs, or a classifier's encoder.onnx), in the endpoint's precision (`*.int8.onnx` for int8), copied beside
    the front model."""
    precision = next(e.precision for e in task.endpoints() if e.name == folder.parent.name)
    graphs = [
        path for path in sorted(checkpoint.glob("*.onnx")) if path.name.endswith(".int8.onnx") == (precision == "int8")
    ]
    weights = [data for path in graphs for data in [path.with_name(path.name + ".data")] if data.is_file()]
    return [_linked(path, folder / path.name) for path in graphs + weights]


def _linked(source: Path, destination: Path) -> Path:
    """`source` at `destination`: a hard link where the file system allows one (an imported LLM's weights are
    gigabytes, and the endpoint and its streaming twin read the same), else a copy."""
    destination.unlink(missing_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
    return destination


def explainer(task: Task, checkpoint: Path, destination: Path) -> Path:
    from export.graphs.explain_export import export_explainer

    return export_explainer(task.name, checkpoint, destination)


# ---------------------------------------------------------------------------------------------------------------


def resolve(reference: str) -> Callable[[Task, Path, Path], Path]:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def source_folder(task: Task, checkpoints: Path) -> Path:
    """Where the task's assets and weights live: its checkpoint folder, or the folder of its definition."""
    return checkpoints / task.checkpoint if task.checkpoint else task.folder


def front_files(task: Task, source: Path) -> list[Path]:
    """The files each front model's version folder receives."""
    files = [source / name for name in task.assets]
    for endpoint in task.endpoints():
        module = task.folder / (endpoint.front.partition(":")[0].replace(".", "/") + ".py")
        if module.is_file() and module not in files:  # a task module shipped beside its definition
            files.append(module)
    return files


def build_task(task: Task, source: Path, repository: Path) -> list[Path]:
    written = []
    for model in task.models():
        destination = repository / model.name / "1" / "model.onnx"
        destination.parent.mkdir(parents=True, exist_ok=True)
        if model.export:
            written.append(resolve(model.export)(task, source, destination))
        else:
            written.append(Path(shutil.copy2(task.folder / model.file, destination)))
    for endpoint in task.endpoints():
        folder = repository / endpoint.name / "1"
        folder.mkdir(parents=True, exist_ok=True)
        if endpoint.graphs:
            written += resolve(endpoint.graphs)(task, source, folder)
        written.append(Path(shutil.copy2(FRONT_MODEL_PY, folder / "model.py")))
        written.append(Path(shutil.copy2(task.source, folder / task.source.name)))
        written += [Path(shutil.copy2(path, folder / path.name)) for path in front_files(task, source)]
    return written


def build(
    checkpoints: Path,
    repository: Path,
    tasks: list[str] | None = None,
    force: bool = False,
    definitions: dict[str, Task] | None = None,
) -> list[str]:
    """Build every task whose checkpoint exists; returns the tasks that were (re)built."""
    definitions = registry() if definitions is None else definitions
    stamp_path = repository / STAMP
    stamp = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
    built = []
    for task in definitions.values():
        if tasks and task.name not in tasks:
            continue
        source = source_folder(task, checkpoints)
        missing = [p for p in front_files(task, source) if not p.is_file()]
        if missing:
            print(f"skip {task.name}: {', '.join(map(str, missing))} missing")
            continue
        fp = fingerprint(task, source)
        outputs = [repository / m.name / "1" / "model.onnx" for m in task.models()]
        outputs += [repository / e.name / "1" / "model.py" for e in task.endpoints()]
        outputs_exist = all(path.exists() for path in outputs)
        if not force and stamp.get(task.name) == fp and outputs_exist:
            print(f"{task.name}: up to date")
            continue
        t0 = time.monotonic()
        print(f"{task.name}: building from {source} ...", flush=True)
        paths = build_task(task, source, repository)
        names = ", ".join(str(p.relative_to(repository)) for p in paths)
        print(f"{task.name}: wrote {names} in {time.monotonic() - t0:.1f}s")
        stamp[task.name] = fp
        built.append(task.name)
    repository.mkdir(parents=True, exist_ok=True)
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.build_repository", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="default: %(default)s")
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository", help="default: %(default)s")
    p.add_argument("--task", action="append", choices=sorted(registry()), help="only these tasks (repeatable)")
    p.add_argument("--force", action="store_true", help="export even when nothing changed")
    args = p.parse_args(argv)
    build(args.checkpoints, args.repository, args.task, args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
