"""An n-gram teacher for the sentiment encoder: soft labels for knowledge distillation.

A linear model over TF-IDF character 1-3-grams is a strong baseline on these review sets (it
beats a small Transformer trained from scratch on 35k texts). Its probabilities carry what the
data says about each review, graded rather than 0/1, and training the encoder towards them as
well as towards the labels (Hinton et al., 2015) regularizes it. The served model is still the
encoder alone; the teacher exists only during training.

The soft label of a training text comes from a teacher that did not see that text (k-fold,
out-of-fold predictions): a teacher fitted on all of train would simply echo its labels.
Needs scikit-learn (the `train` extra).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _model():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    return make_pipeline(
        TfidfVectorizer(analyzer="char", ngram_range=(1, 3), min_df=2, sublinear_tf=True),
        LogisticRegression(C=4.0, max_iter=2000),
    )


def out_of_fold_probabilities(
    texts: Sequence[str], labels: Sequence[int], folds: int = 5, seed: int = 13
) -> np.ndarray:
    """[N, 2] class probabilities; row i from a teacher fitted on the folds that exclude text i."""
    texts, labels = np.asarray(texts, dtype=object), np.asarray(labels)
    fold_of = np.random.default_rng(seed).permutation(len(texts)) % folds
    probs = np.zeros((len(texts), 2), dtype=np.float32)
    for k in range(folds):
        held = fold_of == k
        teacher = _model().fit(texts[~held], labels[~held])
        probs[held] = teacher.predict_proba(texts[held])
    return probs


def fit(texts: Sequence[str], labels: Sequence[int]):
    """The teacher fitted on all given texts: its own dev and test accuracy, and the reading that
    export/training/negation_mining.py mines negated clauses with."""
    return _model().fit(list(texts), list(labels))
