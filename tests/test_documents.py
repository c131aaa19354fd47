"""Documents against the real server: `translate` reads a text as sentences, each a row of the engine, and answers
in the text's layout; its streaming twin sends a document in order; the limits are refused by name; the CLI
translates a file keeping its paragraphs. The splitter itself is tested in test_sentences.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_text import metric_sum, settled

from clients import Client, ClientError
from serving.frontends.sentences import split
from tasks.definition import get

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "我今天早上去了市场。",
    "市场里人很多，我买了一些苹果和香蕉。",
    "回家的路上下雨了，我没有带伞。",
    "到家以后我洗了个热水澡。",
    "晚上妈妈给我打了电话。",
    "你明天有空吗？",
    "我们一起去看电影吧！",
    "这本书很有意思。",
]


def one_by_one(client: Client, sentences: list[str], **options) -> list[str]:
    """Each sentence alone, as one text read whole (today's reading of a one-sentence text)."""
    return client.translate(sentences, split_sentences="0", **options)


@pytest.mark.parametrize("beams", [1, 4])
def test_a_paragraph_is_its_sentences_translated_one_by_one_in_its_layout(triton, beams):
    text = "".join(SENTENCES[:5]) + "\n\n" + "".join(SENTENCES[5:7]) + "\n" + SENTENCES[7]
    with Client(triton.grpc_url) as client:
        answers = one_by_one(client, SENTENCES, num_beams=beams)
        expected = " ".join(answers[:5]) + "\n\n" + " ".join(answers[5:7]) + "\n" + answers[7]
        assert client.translate(text, num_beams=beams)[0] == expected
        # nonewlines reads the same text the same way here (every line ends a sentence)
        assert client.translate(text, num_beams=beams, split_sentences="nonewlines")[0] == expected
        # SPLIT_SENTENCES=0: the paragraph is one text, as the model alone reads it (what was mangled)
        whole = client.translate(text, num_beams=beams, split_sentences="0")[0]
        assert whole != expected and "\n" not in whole


def test_a_forty_sentence_text_is_translated_whole(triton):
    sentences = [SENTENCES[i % len(SENTENCES)] for i in range(40)]
    with Client(triton.http_url, "http") as client:
        answers = one_by_one(client, SENTENCES, num_beams=1)
        answer = client.translate("".join(sentences), num_beams=1)[0]
    assert answer == " ".join(answers[i % len(SENTENCES)] for i in range(40))


def test_texts_over_the_document_limits_are_refused_by_name(triton):
    limits = get("translate").engine  # what the served task's [engine] table says
    sentences, characters = limits.max_document_sentences, limits.max_document_chars
    too_many = "好。" * (sentences + 1)
    too_long = "我" * (characters + 1)
    with Client(triton.grpc_url) as client:
        with pytest.raises(ClientError, match=f"the limit is {sentences} sentences per text"):
            client.translate(too_many)
        with pytest.raises(ClientError, match=f"the limit is {characters:,} characters per text"):
            client.translate(too_long)
        over_the_queue = limits.max_queued_rows // (8 * sentences) + 1  # texts of the most sentences, at beam 8
        with pytest.raises(ClientError, match=f"the limit is {limits.max_queued_rows:,} rows per request"):
            client.translate(["好。" * sentences] * over_the_queue, num_beams=8)
        # at the limit, or with splitting off, the text is translated
        assert client.translate("好。" * sentences, num_beams=1)[0]
        assert client.translate(too_long, split_sentences="0", num_beams=1)[0]


def test_a_sentence_longer_than_the_window_is_cut_at_clauses_not_truncated(triton):
    clauses = ["我们先去了北京", "然后去了上海", "又去了南京和杭州", "最后回到了广州"] * 4
    sentence = "，".join(clauses) + "。"  # one sentence, past translate's 63-token window
    before = settled(lambda: truncated(triton), lambda n: True)  # earlier tests' counts have arrived
    with Client(triton.grpc_url) as client:
        answer = client.translate(sentence, num_beams=1)[0]
        whole = client.translate(sentence, num_beams=1, split_sentences="0")[0]
    assert len(answer.split()) > len(whole.split())  # the part past the window was translated too
    assert settled(lambda: truncated(triton), lambda n: n > before) == before + 1  # only the unsplit one


def truncated(triton) -> float:
    return metric_sum(triton.metrics_url, "ropeserve_truncated_texts_total", model="translate")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_document_streams_in_order_and_adds_up_to_the_answer(triton, protocol):
    text = "".join(SENTENCES[:4]) + "\n\n" + "".join(SENTENCES[4:])
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    with Client(url, protocol) as client:
        for beams in (1, 4):
            pieces = list(client.stream("translate", text, num_beams=beams))
            answer = client.translate(text, num_beams=beams)[0]
            assert "".join(pieces) == answer
            sent = ""
            firsts = one_by_one(client, SENTENCES, num_beams=beams)
            for piece in pieces:  # in document order: each piece extends what came before
                sent += piece
                assert answer.startswith(sent)
            assert len(pieces) >= len(split(text).pieces) // 2 and sent.index(firsts[1]) > sent.index(firsts[0])


def test_sentences_per_text_are_counted(triton):
    name = "ropeserve_sentences_per_text_sum"
    before = settled(lambda: metric_sum(triton.metrics_url, name, model="translate"), lambda n: True)
    with Client(triton.grpc_url) as client:
        client.translate(["".join(SENTENCES[:3]), SENTENCES[0]], num_beams=1)
    after = settled(lambda: metric_sum(triton.metrics_url, name, model="translate"), lambda n: n >= before + 4)
    assert after == before + 4


def test_cli_translates_a_file_keeping_its_paragraphs(triton, tmp_path):
    article = tmp_path / "article.txt"
    article.write_text("".join(SENTENCES[:3]) + "\n\n" + "".join(SENTENCES[3:6]) + "\n", encoding="utf-8")
    with Client(triton.grpc_url) as client:
        answers = one_by_one(client, SENTENCES[:6], num_beams=1)
    expected = " ".join(answers[:3]) + "\n\n" + " ".join(answers[3:6])
    for extra in ([], ["--stream"]):
        args = ["-m", "clients", "translate", "--file", str(article), "--beams", "1", "--url", triton.grpc_url]
        run = subprocess.run([sys.executable, *args, *extra], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert run.stdout.rstrip("\n") == expected, extra
