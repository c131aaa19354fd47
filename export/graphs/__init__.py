"""PyTorch → ONNX: the encoders with fused attention (onnx_export.py), the BeamSearch-op generator
(seq2seq_export.py), the engine's step graphs (step_export.py), the explain variants (explain_export.py), and the
generator's parity with the PyTorch reference (parity.py). `python -m export.build_repository` runs them."""
