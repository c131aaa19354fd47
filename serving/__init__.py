"""Serve the Triton model repository, in two kinds of process.

- :mod:`serving.launcher`, on the host side: starts ``tritonserver`` (``python -m serving``, the one way, used by
  ``make serve``, the images, the tests and the benchmarks), guards its HTTP port, watches its stubs, drains it on
  stop and cleans up after it.
- Everything else runs inside Triton's Python-backend stubs: :mod:`serving.frontends` (the front models),
  :mod:`serving.engine` (continuous batching), :mod:`serving.text` (tokenizer rules, spans),
  :mod:`serving.ort_backend` (the Python-based ``onnxruntime`` backend) and :mod:`serving.providers`.

The two halves do not import each other (import-linter contracts in pyproject.toml).
"""
