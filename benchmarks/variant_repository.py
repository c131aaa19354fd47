"""Temporary model repositories for the serving variants (dynamic batching on/off, instance count).

The committed configs under model_repository/ are never edited: each variant gets a folder whose config files
are rewritten copies and whose model files are symlinks to the built ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from benchmarks.profiles import REPOSITORY
from serving.frontends.sentiment import IN_PROCESS_ENCODER
from serving.ort_backend.session_config import available_cpus

SENTIMENT_MODELS = ("sentiment", "sentiment_encoder")
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
