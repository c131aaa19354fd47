"""Training: the public datasets' readers (data.py), the shared loop (loop.py), the scores it validates with
(scores.py: BLEU/chrF, character ROUGE), one module per task (sentiment.py, seq2seq.py, extractive.py) and the
sentiment model's extra teachers (ngram_teacher.py, negation_mining.py). `python -m export.train` is the command."""
