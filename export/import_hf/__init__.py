"""Import Hugging Face checkpoints a team already has: `python -m export.import_hf PATH --task ... --name NAME`.

translation.py (MarianMTModel → the engine's graphs), marian.py (its forward with fused attention),
sentencepiece_json.py (its tokenizers as `tokenizers` files), bert.py (BERT-family sequence classifiers),
sample_folders.py (small folders built with transformers' own classes, for tests and benchmarks: no hub here).
"""
