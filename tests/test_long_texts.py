"""Texts longer than a model's window: `sentiment` and `summarize` (extractive) read them whole, in windows of whole
sentences (serving/frontends/windows.py), instead of their first tokens only.

The first part needs no server (fake encoders, the real tokenizers); the last tests run against the real server.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from benchmarks.long_reviews import HOTEL_PRAISE, HOTEL_REVIEW, HOTEL_VERDICT
from serving.frontends.base import BatchTokenizer
from serving.frontends.options import NoOptions
from serving.frontends.sentiment import POOLING, SentimentFront, label_and_score
from serving.frontends.summarize import SpanExtractor
from serving.frontends.windows import MAX_WINDOWS, POOLINGS, pool, sentence_windows, window_rows
from serving.text.spans import candidates, window_candidates
from serving.text.tokenizer import BOS_ID, EOS_ID, UNK_ID

ROOT = Path(__file__).resolve().parents[1]
SENTIMENT_TOKENIZER = BatchTokenizer(Tokenizer.from_file(str(ROOT / "checkpoints/sentiment/tokenizer.json")), 128)
SUMMARIZE_MAX_TOKENS = json.loads((ROOT / "checkpoints/summarize/config.json").read_text())["max_tokens"]
SUMMARIZE_TOKENIZER = BatchTokenizer(
    Tokenizer.from_file(str(ROOT / "checkpoints/summarize/tokenizer.json")), SUMMARIZE_MAX_TOKENS
)

GOOD = "房间很好，服务很好，早餐也很好。"
BAD = "房间很差，服务很差，早餐也很差。"
# The filler of a long news text: nothing in it reads like a headline; the news comes after the first window.
FILLER = (
    "嗯，嗯，好的，是的，对，没错，嗯，好的，是的，对，没错，嗯，好的，是的，对，没错，嗯，好的，是的，对，没错。" * 4
)
NEWS = "国务院今天发布通知，决定从明年起全面取消农业税，九亿农民将因此受益。"


def encode(tokenizer: BatchTokenizer, text: str):
    return tokenizer.tokenizer.encode(text, add_special_tokens=False)


def ends_a_sentence(text: str, offsets, token: int) -> bool:
    """The text before this token ends with end punctuation (whitespace aside)."""
    return text[: offsets[token][0]].rstrip()[-1] in "。！？!?"


# --- windows ----------------------------------------------------------------------------------------------


def test_a_text_that_fits_is_one_window_of_all_its_tokens():
    enc = encode(SENTIMENT_TOKENIZER, GOOD * 3)
    assert sentence_windows(GOOD * 3, enc.offsets, 128).bounds == ((0, len(enc.ids)),)
    assert sentence_windows("", [], 128).bounds == ((0, 0),)


def test_windows_are_whole_sentences_packed_up_to_the_window():
    text = "".join(HOTEL_PRAISE) * 3 + HOTEL_VERDICT
    enc = encode(SENTIMENT_TOKENIZER, text)
    read = sentence_windows(text, enc.offsets, 128)
    assert len(read.bounds) > 1 and not read.truncated
    assert read.bounds[0][0] == 0 and read.bounds[-1][1] == len(enc.ids)  # every token, in order, once
    assert all(a[1] == b[0] for a, b in zip(read.bounds, read.bounds[1:]))
    assert all(0 < end - start <= 128 for start, end in read.bounds)
    assert all(ends_a_sentence(text, enc.offsets, start) for start, _ in read.bounds[1:])
    # greedy: the next sentence would not have fitted into the window before it
    for (start, end), (_, next_end) in zip(read.bounds, read.bounds[1:]):
        following = next(
            t for t in range(end + 1, next_end + 1) if t == next_end or ends_a_sentence(text, enc.offsets, t)
        )
        assert following - start > 128


def test_a_sentence_longer_than_the_window_is_cut_at_its_clauses():
    text = "服务很好，" * 100  # one sentence of 200 tokens, a comma every two
    enc = encode(SENTIMENT_TOKENIZER, text)
    read = sentence_windows(text, enc.offsets, 128)
    assert len(read.bounds) == 2 and not read.truncated  # cut after a comma: nothing is lost
    assert text[: enc.offsets[read.bounds[1][0]][0]].endswith("，")


def test_a_clause_longer_than_the_window_is_cut_at_the_window_and_counts_as_truncated():
    text = "好 " * 300 + "。"  # 300 tokens without clause punctuation
    enc = encode(SENTIMENT_TOKENIZER, text)
    read = sentence_windows(text, enc.offsets, 128)
    assert [end - start for start, end in read.bounds] == [128, 128, len(enc.ids) - 256]
    assert read.truncated


def test_a_text_is_read_in_at_most_max_windows():
    text = GOOD * 2000
    enc = encode(SENTIMENT_TOKENIZER, text)
    read = sentence_windows(text, enc.offsets, 128)
    assert len(read.bounds) == MAX_WINDOWS and read.truncated
    assert read.bounds[-1][1] < len(enc.ids)


def test_window_rows_of_a_text_that_fits_are_todays_tokens():
    texts = ["这部电影不差", GOOD * 2, "\x00"]  # the last: the tokenizer empties it
    encodings = SENTIMENT_TOKENIZER.tokenizer.encode_batch(texts, add_special_tokens=False)
    read = window_rows(texts, encodings, 128)
    today = SENTIMENT_TOKENIZER.encode(texts)
    assert read.rows == [list(today.ids[i, : today.lengths[i]]) for i in range(3)]
    assert read.rows[2] == [UNK_ID] and read.owners == [0, 1, 2] and read.lengths() == today.lengths


# --- pooling ----------------------------------------------------------------------------------------------


def test_one_window_is_answered_as_it_was_by_every_pooling():
    logits = np.array([[0.25, -1.5]], dtype=np.float32)
    for how in POOLINGS:
        assert pool(logits, [12], how).tolist() == logits[0].tolist()


def test_poolings():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    lengths = [100, 100, 8]
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)

    def positive(how: str) -> float:
        p = np.exp(pool(logits, lengths, how))
        return float(p[1] / p.sum())

    assert positive("first") == pytest.approx(probs[0, 1])
    assert positive("last") == pytest.approx(probs[2, 1])
    assert np.allclose(pool(logits, lengths, "mean_logits"), [2 / 3, 4 / 3])
    assert positive("mean_probs") == pytest.approx(probs[:, 1].mean())
    assert positive("token_weighted") == pytest.approx((probs[:, 1] * [100, 100, 8]).sum() / 208)
    assert positive("most_confident") == pytest.approx(probs[2, 1])
    assert positive("first_and_last") == pytest.approx(probs[[0, 2], 1].mean())
    assert positive("later_weighted") == pytest.approx((probs[:, 1] * [1, 2, 3]).sum() / 6)
    assert POOLING in POOLINGS and POOLING != "first"


# --- the sentiment front model, with a fake encoder -------------------------------------------------------


class Recorder:
    """Stands in for FrontMetrics: what the front model reported."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.truncated: list[bool] = []
        self.window_counts: list[int] = []

    def encoded(self, lengths, truncated) -> None:
        self.lengths += list(lengths)
        self.truncated += list(truncated)

    def windows(self, counts) -> None:
        self.window_counts += list(counts)


class WordCounter:
    """A fake encoder graph: positive logit = tokens with 好 in them − tokens with 差 in them, in the row."""

    def __init__(self) -> None:
        vocab = SENTIMENT_TOKENIZER.tokenizer.get_vocab()
        self.good = [i for token, i in vocab.items() if "好" in token]
        self.bad = [i for token, i in vocab.items() if "差" in token]
        self.rows: list[list[int]] = []

    def run(self, outputs, feeds):
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        self.rows += [list(row[m == 1]) for row, m in zip(ids, mask, strict=True)]
        score = (np.isin(ids, self.good) & (mask == 1)).sum(axis=1) - (np.isin(ids, self.bad) & (mask == 1)).sum(axis=1)
        return [np.stack([np.zeros(len(ids)), score], axis=1).astype(np.float32)]


def sentiment_front() -> SentimentFront:
    front = SentimentFront.__new__(SentimentFront)  # no Triton: only what run_group uses
    front.tokenizer, front.labels = SENTIMENT_TOKENIZER, ["negative", "positive"]
    front.session, front.metrics = WordCounter(), Recorder()
    return front


def test_sentiment_reads_a_long_review_whole():
    front = sentiment_front()
    review = GOOD * 12 + BAD * 30  # praise for the first window, complaints for the next ones
    short = GOOD + BAD + BAD
    (long_result, short_result) = front.run_group([review, short], NoOptions())
    assert long_result[0] == "negative"  # read only its first 128 tokens, it would be positive
    assert short_result == label_and_score(np.array([[0.0, -3.0]], dtype=np.float32), front.labels)[0]
    rows = front.session.rows
    assert sorted(map(len, rows))[-1] <= 128 and len(rows) > 2
    assert front.metrics.window_counts == [len(rows) - 1, 1]
    assert front.metrics.truncated == [False, False]  # read whole: not truncated
    assert front.metrics.lengths == [len(encode(SENTIMENT_TOKENIZER, t).ids) for t in (review, short)]


def test_sentiment_of_a_text_that_fits_is_todays_encoder_row():
    front = sentiment_front()
    texts = ["这部电影不差", GOOD * 3, "服务一点也不好"]
    front.run_group(texts, NoOptions())
    today = SENTIMENT_TOKENIZER.encode(texts)
    assert sorted(front.session.rows) == sorted(list(today.ids[i, : today.lengths[i]]) for i in range(3))
    assert front.metrics.window_counts == [1, 1, 1] and front.metrics.lengths == today.lengths


def test_a_review_past_max_windows_counts_as_truncated():
    front = sentiment_front()
    front.run_group([GOOD * 2000], NoOptions())
    assert front.metrics.window_counts == [MAX_WINDOWS] and front.metrics.truncated == [True]


# --- extractive summaries, with a fake scorer -------------------------------------------------------------


class FakeScorer:
    """A real SpanExtractor whose scorer likes the tokens of one phrase (and records its rows)."""

    def __init__(self, liked: str) -> None:
        self.metrics = Recorder()
        self.liked = set(SUMMARIZE_TOKENIZER.tokenizer.encode(liked, add_special_tokens=False).ids)
        self.rows: list[np.ndarray] = []
        self.extract = SpanExtractor(SUMMARIZE_TOKENIZER, self.metrics, self.score).extract

    def score(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        ids = feeds["input_ids"]
        self.rows += [row[m == 1] for row, m in zip(ids, feeds["attention_mask"], strict=True)]
        return np.isin(ids, list(self.liked)).astype(np.float32)


def test_an_extractive_summary_can_come_from_past_the_first_window():
    text = FILLER + NEWS
    scorer = FakeScorer("取消农业税")
    (summary,) = scorer.extract([text])
    assert "取消农业税" in summary and summary in NEWS
    assert len(encode(SUMMARIZE_TOKENIZER, text).ids) > SUMMARIZE_MAX_TOKENS - 2
    assert len(scorer.rows) == 2 and all(len(r) <= SUMMARIZE_MAX_TOKENS for r in scorer.rows)
    assert all(r[0] == BOS_ID and r[-1] == EOS_ID for r in scorer.rows)
    assert scorer.metrics.window_counts == [2] and scorer.metrics.truncated == [False]


def test_an_extractive_summary_of_a_text_that_fits_is_built_as_in_training():
    scorer = FakeScorer("取消农业税")
    (summary,) = scorer.extract([NEWS])
    enc = encode(SUMMARIZE_TOKENIZER, NEWS)
    built = candidates(NEWS, enc.ids, enc.offsets, SUMMARIZE_MAX_TOKENS)
    assert scorer.rows[0].tolist() == built.ids and summary in built.texts
    assert scorer.metrics.window_counts == [1] and scorer.metrics.lengths == [len(built.ids)]


def test_window_candidates_lie_inside_their_window():
    text = FILLER + NEWS
    enc = encode(SUMMARIZE_TOKENIZER, text)
    read = sentence_windows(text, enc.offsets, SUMMARIZE_MAX_TOKENS - 2)
    assert len(read.bounds) == 2
    first, last = read.bounds[1]
    found = window_candidates(text, enc.ids, enc.offsets, first, last)
    assert found.ids == [BOS_ID, *enc.ids[first:last], EOS_ID] and not found.truncated
    window = text[enc.offsets[first][0] : enc.offsets[last - 1][1]]
    assert window.endswith(NEWS) and FILLER.endswith(window[: -len(NEWS)])  # whole sentences
    assert all(t in window for t in found.texts) and "决定从明年起全面取消农业税" in found.texts
    assert all(1 <= p <= last - first for positions in found.positions for p in positions)


# --- the real server ----------------------------------------------------------------------------------------

# A review whose complaints fill the two windows after one of praise.
MOSTLY_COMPLAINTS = "".join(HOTEL_PRAISE) + (
    "可是入住以后才发现，前台的服务态度太差了，办入住等了一个多小时，问问题还被服务员骂。"
    "房间里的空调是坏的，打电话叫人来修，等了一个晚上也没有人来。"
    "卫生间很脏，毛巾上还有头发，床单也不干净，让人非常恶心。"
    "退房的时候又被多收了两百块钱，找经理理论，经理的态度比前台还差。"
    "隔壁房间吵了一整夜，打电话给前台投诉，前台说管不了。"
    "早餐又贵又难吃，鸡蛋是凉的，咖啡像水一样。"
    "房间的窗户关不严，外面的风一直往里灌，冻得一晚上没睡好。"
    "热水要放二十分钟才有，洗澡洗到一半又变成了冷水。"
    "电视遥控器是坏的，网络也连不上，打电话问前台，前台只会说不知道。"
    "停车场收费特别贵，而且根本没有车位，只能停到外面的马路上。"
    "这是我住过最差的一家酒店，服务太差了，我再也不会来这家酒店了！"
)


@pytest.fixture
def client(triton):
    from clients import Client

    with Client(triton.grpc_url) as c:
        yield c


def test_the_server_reads_a_long_review_whole(client):
    praise = "".join(HOTEL_PRAISE)
    assert len(encode(SENTIMENT_TOKENIZER, praise).ids) > 120  # the verdict lies past the 128-token window
    first_window, complaints, hotel, short = client.sentiment([praise, MOSTLY_COMPLAINTS, HOTEL_REVIEW, GOOD])
    assert first_window.label == "positive" and first_window.score > 0.95  # what the endpoint read before windows
    assert complaints.label == "negative"
    # The shipped pooling (the mean of the windows' logits) does not turn the hotel review with one closing
    # verdict negative (docs/models.md): it takes it from 0.99 positive to a toss-up.
    assert hotel.label == "negative" or hotel.score < 0.75
    assert short == client.sentiment([GOOD])[0]


def test_the_server_picks_an_extractive_span_past_the_first_window(client):
    text = FILLER + NEWS
    (summary,) = client.summarize([text], mode="extractive")
    assert summary and summary in NEWS  # not in the first window: only filler there


def test_the_server_counts_windows_and_no_truncation_for_a_text_read_whole(triton, client):
    from prometheus_text import settled_sums

    names = ["ropeserve_windows_per_text_sum", "ropeserve_windows_per_text_count", "ropeserve_truncated_texts_total"]
    before = {m: settled_sums(triton.metrics_url, names, model=m) for m in ("sentiment", "summarize")}
    client.sentiment([MOSTLY_COMPLAINTS, GOOD])  # 3 windows and 1
    client.summarize([FILLER + NEWS], mode="extractive")  # 2 windows
    for model, windows, texts in (("sentiment", 4, 2), ("summarize", 2, 1)):
        after = settled_sums(triton.metrics_url, names, at_least=before[model][0] + windows, model=model)
        assert [a - b for a, b in zip(after, before[model], strict=True)] == [windows, texts, 0], model
