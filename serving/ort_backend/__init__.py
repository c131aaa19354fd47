"""A Python-based Triton backend named ``onnxruntime`` that runs ONNX models with ONNX Runtime on CPU.

The embedded server from the ``nvidia-pytriton`` wheel has no native onnxruntime backend, so
:mod:`serving.launcher.backend_dir` copies ``model.py`` to ``<backend-dir>/onnxruntime/model.py`` and this whole
package beside it (as ``ropeserve_ort_backend``). Models whose config says ``platform: "onnxruntime_onnx"``
or ``backend: "onnxruntime"`` are then served by it, unchanged from how the NGC image serves them natively.

``model.py`` holds only the Triton entry points; the logic lives in pure-Python modules that unit tests
import without a server: :mod:`.batching` (validate, group, concatenate, split) and :mod:`.session_config`
(model config -> ONNX Runtime session options, types and auto-complete).
"""
