"""Candidate spans of extractive summaries (serving/text/spans.py): what training and the front model both rank."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from serving.text.spans import MAX_SPAN_CHARS, candidates, clauses, span_text, spans
from serving.text.tokenizer import BOS_ID, EOS_ID

NEWS = (
    "面对撤资中国内地及香港的传言，李嘉诚希望用数字说话：长和系去年毛收入约4300亿港元，"
    "本年度投资海外两基建项目仅动用80亿。“说撤资是一个大笑话！”（南方日报）"
)
TOKENIZER = Tokenizer.from_file("checkpoints/summarize/tokenizer.json")


def test_spans_are_runs_of_whole_clauses_up_to_the_limit():
    pieces = clauses(NEWS)
    starts, ends = {s for s, _ in pieces}, {e for _, e in pieces}
    found = spans(NEWS)
    assert len(found) > len(pieces)  # single clauses and runs of them
    for start, end in found:
        assert start in starts and end in ends
        single = (start, end) in pieces
        assert single or end - start <= MAX_SPAN_CHARS
    assert span_text(NEWS, found[0]) == "面对撤资中国内地及香港的传言"  # the closing comma is not part of a headline


@given(st.text(alphabet="天气很好，。！？ab 1\n", max_size=80))
def test_clauses_are_ordered_disjoint_and_cover_every_word(text):
    pieces = clauses(text)
    assert all(a[1] <= b[0] for a, b in zip(pieces, pieces[1:]))
    covered = "".join(text[s:e] for s, e in pieces)
    assert [c for c in covered if c in "天气很好ab1"] == [c for c in text if c in "天气很好ab1"]


def test_a_text_without_punctuation_is_one_span():
    assert spans("没有标点的一段很长的文字" * 5) == [(0, 60)]


def test_candidates_read_only_what_the_scorer_reads():
    enc = TOKENIZER.encode(NEWS, add_special_tokens=False)
    full = candidates(NEWS, enc.ids, enc.offsets, max_tokens=512)
    short = candidates(NEWS, enc.ids, enc.offsets, max_tokens=20)
    assert full.ids == [BOS_ID, *enc.ids, EOS_ID] and not full.truncated
    assert short.ids == [BOS_ID, *enc.ids[:18], EOS_ID] and short.truncated
    assert short.texts == ["面对撤资中国内地及香港的传言"]  # the only span that ends inside the 18 tokens
    for text, positions in zip(full.texts, full.positions, strict=True):
        covered = "".join(NEWS[enc.offsets[p - 1][0] : enc.offsets[p - 1][1]] for p in positions)
        assert text.strip("“”（）！") in covered or covered in text, (text, covered)


def test_a_text_the_tokenizer_empties_still_has_one_candidate():
    found = candidates("\x00\x01", [], [], max_tokens=160)
    assert len(found.texts) == 1 and found.positions == [[1]] and len(found.ids) == 3
