"""The models in PyTorch: the Transformer (transformer.py) with its config (config.py), attention (attention.py),
position schemes (positional.py), the copy head (heads.py), checkpoint folders (checkpoint.py) and the reference
greedy and beam search (reference_search.py)."""
