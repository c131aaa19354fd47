"""The ONNX variants of the sentiment encoder that the runtime comparison runs: decomposed, fused, int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from export.graphs.onnx_export import export_encoder_classifier
from export.graphs.step_export import rope_path_nodes  # shared with the engine's int8 step graphs
from serving.ort_backend.session_config import OrtSettings, available_cpus, session_options
from serving.providers import inference_session


def session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    """An ORT session built with the same options the served backend uses (threads = usable cores), on CUDA
    where onnxruntime-gpu has it, else the CPU (serving/providers.py; ROPESERVE_ORT_PROVIDERS overrides)."""
    options = session_options(OrtSettings(intra_op_threads=threads or available_cpus()))
    return inference_session(path, options)


def export_decomposed(model: nn.Module, out_path: Path) -> Path:
    """The same model exported with plain MatMul/Softmax attention: the baseline of the fused operators."""
    return export_encoder_classifier(model, out_path, attention="sdpa")


def quantize_int8(src: Path, dst: Path) -> list[str]:
    """Dynamic int8 quantization of the MatMul weights, RoPE path excluded; returns the excluded node names.

    Only MatMul is quantized: the embedding Gather would gain memory, not speed, and costs accuracy.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(src))
    excluded = rope_path_nodes(proto)
    # The exporter's value_info records shapes from its example batch; ONNX shape inference inside the
    # quantizer then contradicts them ("existing shape differs"). Shapes are re-inferred, so drop them.
    del proto.graph.value_info[:]
    plain = dst.with_name(dst.stem + "_input.onnx")
    onnx.save(proto, str(plain))
    quantize_dynamic(
        str(plain),
        str(dst),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=excluded,
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return excluded


class OrtClassifier(nn.Module):
    """An ORT session behind the (input_ids, attention_mask) → logits interface of the PyTorch classifier,
    so the project's evaluation (:func:`export.training.sentiment.predict`) runs on it unchanged."""

    def __init__(self, sess: ort.InferenceSession) -> None:
        super().__init__()
        self.sess = sess

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {"input_ids": input_ids.numpy().astype(np.int64), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(self.sess.run(["logits"], feeds)[0])
