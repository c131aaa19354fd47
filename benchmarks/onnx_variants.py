"""The ONNX variants of the sentiment encoder that the runtime comparison runs: decomposed, fused, int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from export.onnx_export import export_encoder_classifier
from export.providers import inference_session
from serving.ort_backend.session_config import OrtSettings, available_cpus, session_options

ROPE_TABLE_MARK = "rope_"  # initializer names of the precomputed cos/sin tables (encoder.rope_cos/rope_sin)


def session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    """An ORT session built with the same options the served backend uses (threads = usable cores), on CUDA
    where onnxruntime-gpu has it, else the CPU (export/providers.py; ROPESERVE_ORT_PROVIDERS overrides)."""
    options = session_options(OrtSettings(intra_op_threads=threads or available_cpus()))
    return inference_session(path, options)


def export_decomposed(model: nn.Module, out_path: Path) -> Path:
    """The same model exported with plain MatMul/Softmax attention: the baseline of the fused operators."""
    return export_encoder_classifier(model, out_path, attention="sdpa")


def rope_path_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes on the RoPE path: those reading the cos/sin tables, and every node computing their other inputs
    (positions). Quantizing any of them would round the rotation angles, which ruins long positions."""
    producers = {out: node for node in model.graph.node for out in node.output}
    tables = {init.name for init in model.graph.initializer if ROPE_TABLE_MARK in init.name}
    readers = [node for node in model.graph.node if tables.intersection(node.input)]
    names: set[str] = set()
    stack = [name for node in readers for name in node.input[1:] if name not in tables]
    names.update(node.name for node in readers)
    while stack:
        node = producers.get(stack.pop())
        if node is None or node.name in names:
            continue
        names.add(node.name)
        stack.extend(node.input)
    return sorted(names)


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
    so the project's evaluation (:func:`export.sentiment.predict`) runs on it unchanged."""

    def __init__(self, sess: ort.InferenceSession) -> None:
        super().__init__()
        self.sess = sess

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {"input_ids": input_ids.numpy().astype(np.int64), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(self.sess.run(["logits"], feeds)[0])
