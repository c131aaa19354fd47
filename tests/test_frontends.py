"""Front-model helpers, called directly (no server): validation, batch tokenization, outputs."""

import re
from pathlib import Path

import everyday
import numpy as np
import pytest
from tokenizers import Tokenizer

from export.training.seq2seq import TASKS
from serving.frontends.base import (
    BatchTokenizer,
    Encoded,
    InputError,
    decode_choice_option,
    decode_int_option,
    decode_texts,
    length_buckets,
    to_column,
)
from serving.frontends.sentiment import label_and_score
from serving.text.tokenizer import detokenize, settled_prefix, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data"


def as_bytes_tensor(*items):
    return np.array(list(items), dtype=np.object_).reshape(-1, 1)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(
        ["这部电影不差", "服务一点也不好", "hello world 我爱你"] * 3, vocab_size=120, min_frequency=1
    )


def test_decode_texts_accepts_utf8_and_mixed_scripts():
    texts = decode_texts(as_bytes_tensor("这部电影不差".encode(), "I ❤ 北京 🚀".encode()))
    assert texts == ["这部电影不差", "I ❤ 北京 🚀"]


@pytest.mark.parametrize(
    "item,message",
    [
        (b"", r"TEXT\[0\] is empty"),
        (b"  \t\n ", r"TEXT\[0\] is empty"),
        (b"\x00\x01\x02", "only control characters"),
        (b"\xff\xfe bad", r"TEXT\[0\] is not valid UTF-8"),
    ],
)
def test_decode_texts_names_the_problem(item, message):
    with pytest.raises(InputError, match=message):
        decode_texts(as_bytes_tensor(item))


def test_decode_texts_rejects_wrong_shape_and_dtype():
    with pytest.raises(InputError, match=r"shape \[batch, 1\]"):
        decode_texts(np.array([[b"a", b"b"]], dtype=np.object_))
    with pytest.raises(InputError, match="BYTES"):
        decode_texts(np.zeros((1, 1), dtype=np.int32))


def test_int_option_range_and_consistency():
    assert decode_int_option(None, "NUM_BEAMS", 2, 4, 1, 8) == 4
    assert decode_int_option(np.array([[3], [3]], dtype=np.int32), "NUM_BEAMS", 2, 4, 1, 8) == 3
    with pytest.raises(InputError, match="NUM_BEAMS must be between 1 and 8, got 9"):
        decode_int_option(np.array([[9]], dtype=np.int32), "NUM_BEAMS", 1, 4, 1, 8)
    with pytest.raises(InputError, match="the same for every text"):
        decode_int_option(np.array([[1], [2]], dtype=np.int32), "NUM_BEAMS", 2, 4, 1, 8)


MODES = ("abstractive", "extractive")


def test_choice_option_is_one_string_per_request_among_the_choices():
    assert decode_choice_option(None, "MODE", 2, "abstractive", MODES) == "abstractive"
    assert decode_choice_option(as_bytes_tensor(b"extractive", b"extractive"), "MODE", 2, "abstractive", MODES) == (
        "extractive"
    )
    assert decode_choice_option(as_bytes_tensor("extractive"), "MODE", 3, "abstractive", MODES) == "extractive"


@pytest.mark.parametrize(
    "raw,message,reason",
    [
        (as_bytes_tensor(b"short"), "MODE must be one of abstractive, extractive, got 'short'", "option_out_of_range"),
        (as_bytes_tensor(b"Extractive"), "got 'Extractive'", "option_out_of_range"),  # no case folding
        (as_bytes_tensor(b"abstractive", b"extractive"), "the same for every text", "option_mismatch"),
        (as_bytes_tensor(b"\xffx"), "MODE is not valid UTF-8", "invalid_utf8"),
        (
            np.array([[1]], dtype=np.int32),
            "MODE must be BYTES (UTF-8 text: one of abstractive, extractive)",
            "bad_datatype",
        ),
        (
            as_bytes_tensor(b"extractive", b"extractive", b"extractive"),
            "one value per text (shape [2, 1])",
            "bad_shape",
        ),
    ],
)
def test_choice_option_names_the_input_and_the_allowed_values(raw, message, reason):
    with pytest.raises(InputError, match=re.escape(message)) as err:
        decode_choice_option(raw, "MODE", 2, "abstractive", MODES)
    assert err.value.reason == reason


def test_batch_tokenizer_pads_once_to_multiple_of_eight_and_truncates(tokenizer):
    bt = BatchTokenizer(tokenizer, max_tokens=10)
    enc = bt.encode(["我爱你", "这部电影不差" * 5, "\u200b"])
    assert enc.ids.shape == (3, 16) and enc.ids.dtype == np.int64
    assert enc.lengths == [3, 10, 1]  # the zero-width-only text reads as one unknown token
    assert enc.truncated == [False, True, False]
    assert enc.mask.sum(axis=1).tolist() == enc.lengths
    assert (enc.ids[enc.mask == 0] == 0).all()


def test_label_and_score_is_softmax_of_the_winner():
    rows = label_and_score(np.array([[0.0, 2.0], [3.0, -1.0]], dtype=np.float32), ["negative", "positive"])
    assert rows[0][0] == "positive" and rows[0][1] == pytest.approx(1 / (1 + np.exp(-2.0)))
    assert rows[1][0] == "negative" and rows[1][1] == pytest.approx(1 / (1 + np.exp(-4.0)))


def test_to_column_encodes_strings_as_utf8_bytes():
    col = to_column(["positive", "负面"], np.object_)
    assert col.shape == (2, 1) and col[1, 0] == "负面".encode()
    assert to_column([0.5, 0.25], np.float32).dtype == np.float32


def test_length_buckets_cover_every_row_once_shortest_first():
    lengths = [5, 120, 9, 30, 7, 12, 60, 8, 40, 33, 31, 6, 200]
    buckets = length_buckets(lengths)
    assert sorted(r for b in buckets for r in b) == list(range(len(lengths)))
    assert [max(lengths[r] for r in b) for b in buckets] == sorted(max(lengths[r] for r in b) for b in buckets)
    assert [lengths[r] for r in buckets[0]] == [5, 6, 7, 8]  # the short ones are not padded to 200
    assert [[lengths[r] for r in b] for b in buckets[1:3]] == [[9, 12], [30, 31]]  # each padded to 16, to 32
    assert length_buckets([4, 4]) == [[0, 1]] and length_buckets([]) == []


def test_taking_rows_pads_them_to_their_own_longest():
    ids = np.arange(2 * 24).reshape(2, 24)
    mask = np.array([[1] * 5 + [0] * 19, [1] * 20 + [0] * 4])
    batch = Encoded(ids, mask, [5, 20], [False, True])
    short = batch.take([0])
    assert short.ids.shape == (1, 8) and short.mask.sum() == 5 and short.truncated == [False]
    assert batch.take([1, 0]).ids.shape == (2, 24)


@pytest.mark.parametrize("checkpoint", ["translate", "summarize"])
def test_streamed_prefixes_only_ever_grow_into_the_answer(checkpoint):
    """What a stream sends of a partial answer (`settled_prefix` of its text so far) is, at every token, the
    start of the final answer's text: on the shipped target tokenizers, over real target sentences (every
    token of them) and the contractions that detokenizing joins."""
    target = Tokenizer.from_file(str(ROOT / "checkpoints" / checkpoint / "target_tokenizer.json"))
    if DATA_DIR.is_dir():
        texts = [pair.target for pair in TASKS[checkpoint].reader(DATA_DIR)[1][:300]]
    else:  # a bare clone: sentences written for the tests, in the target's language
        texts = list(everyday.ENGLISH) if checkpoint == "translate" else everyday.runs(120)
    texts += ["Don't you think it's Tom's?", "I'm sure we'll go, won't we?", "rock 'n' roll", "他说：“好的。”OK"]
    early = 0  # partial answers that already show all their text: nothing held back
    for text in texts:
        tokens = target.encode(text, add_special_tokens=False).ids
        answer = detokenize(target, tokens)
        for n in range(1, len(tokens)):
            partial = settled_prefix(detokenize(target, tokens[:n]))
            assert answer.startswith(partial), (text, n, partial, answer)
            early += partial == detokenize(target, tokens[:n])
    assert early > 0.9 * sum(len(target.encode(t, add_special_tokens=False).ids) - 1 for t in texts)
