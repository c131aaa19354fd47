"""Iteration-level (continuous) batching for the encoder-decoder tasks: engine.py drives the step graphs of
export/graphs/step_export.py, search.py holds the per-source greedy and beam search."""
