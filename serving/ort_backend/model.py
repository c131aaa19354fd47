"""Triton entry points of the Python-based ``onnxruntime`` backend (ONNX Runtime, CPU).

Copied to ``<backend-dir>/onnxruntime/model.py`` with the helper package beside it as
``ropeserve_ort_backend``; the logic lives there (see ``serving/ort_backend/__init__.py``).
"""

import json
import os
import sys

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ropeserve_ort_backend import batching, session_config  # noqa: E402  (needs the path above)


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Fill inputs/outputs the config leaves out, from the ONNX file (found via the stub's argv[1])."""
        config = auto_complete_model_config.as_dict()
        if config.get("input") and config.get("output"):
            return auto_complete_model_config
        path = session_config.stub_model_file()
        if path is None or not path.is_file():
            return auto_complete_model_config
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        batched = config.get("max_batch_size", 0) > 0
        for kind, args in (("input", session.get_inputs()), ("output", session.get_outputs())):
            if config.get(kind):
                continue
            tensors = [session_config.ModelTensor.from_node_arg(arg) for arg in args]
            for entry in session_config.autocomplete_entries(tensors, batched):
                getattr(auto_complete_model_config, f"add_{kind}")(entry)
        return auto_complete_model_config

    def initialize(self, args):
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.batched = config.get("max_batch_size", 0) > 0
        self.inputs = [batching.TensorSpec.from_config(entry) for entry in config.get("input", [])]
        self.outputs = [batching.TensorSpec.from_config(entry) for entry in config.get("output", [])]
        self.output_names = [spec.name for spec in self.outputs]

        path = session_config.model_file(args["model_repository"], args["model_version"], config)
        if not path.is_file():
            raise pb_utils.TritonModelException(f"model '{self.name}': ONNX file not found: {path}")
        settings = session_config.parse_settings(config, session_config.available_cpus())
        self.session = ort.InferenceSession(
            str(path), session_config.session_options(settings), providers=["CPUExecutionProvider"]
        )
        self.run_options = session_config.run_options(settings)
        session_config.check_against_model(
            self.inputs,
            self.outputs,
            [session_config.ModelTensor.from_node_arg(arg) for arg in self.session.get_inputs()],
            [session_config.ModelTensor.from_node_arg(arg) for arg in self.session.get_outputs()],
            self.batched,
        )
        pb_utils.Logger.log_info(
            f"onnxruntime (python) model '{self.name}' loaded from {path}: intra_op_threads="
            f"{settings.intra_op_threads} inter_op_threads={settings.inter_op_threads} "
            f"graph={settings.graph_level} batched={self.batched}"
        )

    def execute(self, requests):
        tensors = []
        for request in requests:
            present = {}
            for spec in self.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
                if tensor is not None:
                    present[spec.name] = tensor.as_numpy()
            tensors.append(present)

        responses = [None] * len(requests)
        groups, errors = batching.plan_batches(tensors, self.inputs, self.batched)
        for index, message in errors.items():
            responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"model '{self.name}': {message}"))
        for group in groups:
            try:
                results = self.session.run(self.output_names, group.feed(), self.run_options)
                per_request = batching.split_outputs(
                    dict(zip(self.output_names, results, strict=True)), group.batch_sizes
                )
            except Exception as exc:  # one failing group must not take the rest of the batch down
                error = pb_utils.TritonError(f"model '{self.name}': ONNX Runtime failed: {exc}")
                for index in group.indices:
                    responses[index] = pb_utils.InferenceResponse(error=error)
                continue
            for index, outputs in zip(group.indices, per_request, strict=True):
                responses[index] = pb_utils.InferenceResponse(
                    [pb_utils.Tensor(name, outputs[name]) for name in self.output_names]
                )
        return responses

    def finalize(self):
        self.session = None
