"""Studies of trained checkpoints: the sentiment test sets (sentiment_scores.py), the names probe
(name_probes.py) and the positional-encoding ablation (ablation.py)."""
