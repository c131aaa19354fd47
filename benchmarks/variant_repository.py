"""Temporary model repositories for the serving variants: sentiment with dynamic batching on/off and other instance
counts, and `translate` on the BeamSearch-op front (the translation section's baseline).

The committed configs under model_repository/ are never edited: each variant gets a folder whose config and
definition files are rewritten copies and whose model files are symlinks to the built ones.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from benchmarks.profiles import REPOSITORY
from serving.frontends.sentiment import IN_PROCESS_ENCODER
from serving.ort_backend.session_config import available_cpus

SENTIMENT_MODELS = ("sentiment", "sentiment_encoder")
TRANSLATE, GENERATOR_MODEL = "translate", "translate_generator"
GENERATION_FRONT = "serving.frontends.beam_search_op:BeamSearchOpFront"
SPLIT_OPTION = "split_sentences"  # the engine's front reads it; the BeamSearch-op front reads texts whole
THROUGHPUT_QUEUE_SIZE = 4096  # a committed queue limit would reject requests at concurrency 32: raise it


@dataclass(frozen=True)
class ServingVariant:
    """Dynamic batching on/off and the instance count of both sentiment models; ``None`` keeps the committed
    setting, so ``ServingVariant()`` is the endpoint as shipped (only its queue limit raised)."""

    batching: bool | None = None
    instances: int | None = None
    queue_policy: bool = True  # False: drop the committed default_queue_policy (queue limit and timeout)
    bls_encoder: bool = False  # True: the front model calls `sentiment_encoder` by BLS (no in-process encoder)

    @property
    def name(self) -> str:
        if self.bls_encoder:
            return "served_bls_encoder"
        if self.batching is None and self.instances is None:
            return "served" if self.queue_policy else "served_without_queue_policy"
        batching = {None: "", True: "batching_", False: "no_batching_"}[self.batching]
        return batching + (f"{self.instances}inst" if self.instances else "as_committed")


def rewrite_config(text: str, variant: ServingVariant) -> str:
    """A config.pbtxt with the variant's batching, instance count and threads per instance, and a queue limit
    high enough for throughput runs (read and written with Triton's own ModelConfig message)."""
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    if variant.batching is False:
        config.ClearField("dynamic_batching")
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not variant.queue_policy:
            batching.ClearField("default_queue_policy")
        elif batching.default_queue_policy.max_queue_size:
            batching.default_queue_policy.max_queue_size = THROUGHPUT_QUEUE_SIZE
    if variant.instances is not None:
        # Same thread budget for every instance count: n instances × (cores / n) intra-op threads each.
        if "intra_op_thread_count" in config.parameters:
            threads = max(1, available_cpus() // variant.instances)
            config.parameters["intra_op_thread_count"].string_value = str(threads)
        del config.instance_group[:]
        config.instance_group.add(count=variant.instances, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    return text_format.MessageToString(config)


def build(root: Path, variant: ServingVariant, models: tuple[str, ...] = SENTIMENT_MODELS) -> Path:
    """Write the variant's repository under ``root / variant.name`` and return it."""
    repo = Path(root) / variant.name
    for model in models:
        for source in (REPOSITORY / model).rglob("*"):
            if "__pycache__" in source.parts or source.is_dir():
                continue
            if variant.bls_encoder and source.name == IN_PROCESS_ENCODER:  # without it the front model uses BLS
                continue
            target = repo / model / source.relative_to(REPOSITORY / model)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.suffix == ".pbtxt":
                target.write_text(rewrite_config(source.read_text(encoding="utf-8"), variant), encoding="utf-8")
            else:
                target.symlink_to(source.resolve())
    return repo


# -- `translate` on the BeamSearch-op front --------------------------------------------------------------------


def variant_definition(text: str) -> str:
    """The task definition with `translate` on the BeamSearch-op front (the setup the engine replaced, which reads
    every text whole): the [endpoint] table's front line replaced and the [options.split_sentences] table left
    out; nothing else changes (checked by parsing the result)."""
    before = tomllib.loads(text)
    lines = text.splitlines(keepends=True)
    header = re.compile(r"^\s*\[")
    start = next((i for i, line in enumerate(lines) if line.strip() == "[endpoint]"), None)
    if start is None:
        raise ValueError("the definition has no [endpoint] table")
    for i in range(start + 1, len(lines)):
        if header.match(lines[i]):
            raise ValueError("[endpoint] has no front = … line")
        if re.match(r"^\s*front\s*=", lines[i]):
            lines[i] = f"front = {json.dumps(GENERATION_FRONT)}\n"  # a TOML basic string is a JSON string
            break
    split = next((i for i, line in enumerate(lines) if line.strip() == f"[options.{SPLIT_OPTION}]"), None)
    if split is not None:
        end = next((i for i in range(split + 1, len(lines)) if header.match(lines[i])), len(lines))
        del lines[split:end]
    out = "".join(lines)
    after = tomllib.loads(out)
    expected = json.loads(json.dumps(before))
    expected["endpoint"]["front"] = GENERATION_FRONT
    expected.get("options", {}).pop(SPLIT_OPTION, None)
    if after != expected:
        raise ValueError("rewriting the definition changed more than [endpoint] front and the split option")
    return out


def build_translate_variant(root: Path, repository: Path = REPOSITORY) -> Path:
    """A repository under ``root`` holding `translate` on the BeamSearch-op front and the generator it calls,
    made from the built repository: text files copied (the definitions rewritten), ONNX files symlinked."""
    repo = Path(root) / "translate_beamsearch_op"
    if repo.exists():
        shutil.rmtree(repo)
    for model in (TRANSLATE, GENERATOR_MODEL):
        source_dir = Path(repository) / model
        for source in sorted(source_dir.rglob("*")):
            if "__pycache__" in source.parts or source.is_dir():
                continue
            target = repo / model / source.relative_to(source_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.suffix == ".toml":
                target.write_text(variant_definition(source.read_text(encoding="utf-8")), encoding="utf-8")
            elif source.suffix == ".onnx":
                target.symlink_to(source.resolve())
            else:
                shutil.copyfile(source, target)
    return repo
