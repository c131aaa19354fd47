"""Run the Triton model repository: the embedded ``tritonserver`` launcher and the ONNX Runtime backend.

One way to start the server, used by ``make serve`` (``python -m serving``), the tests and the benchmarks:
:class:`serving.embedded.EmbeddedTriton`. Beside it: :mod:`serving.wheel` (the Triton files inside the
``nvidia-pytriton`` wheel), :mod:`serving.backend_dir` (the ``--backend-directory`` layout),
:mod:`serving.repository` (pre-start checks) and :mod:`serving.ort_backend` (the Python-based
``onnxruntime`` backend that serves ``platform: "onnxruntime_onnx"`` models on CPU).
"""
