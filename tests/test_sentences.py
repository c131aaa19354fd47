"""Documents as sentences (serving/frontends/sentences.py), the engine's turn-taking between requests, and a
document's reply assembled in order (serving/frontends/engine_front.py `Reply`). No server: the server tests are
in test_documents.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.frontends.sentences import fit, read, split

MARKET = "我今天早上去了市场。市场里人很多，我买了一些苹果和香蕉。回家的路上下雨了！你带伞了吗？"


def test_a_paragraph_splits_after_end_punctuation():
    assert split(MARKET).pieces == (
        "我今天早上去了市场。",
        "市场里人很多，我买了一些苹果和香蕉。",
        "回家的路上下雨了！",
        "你带伞了吗？",
    )


def test_closing_quotes_stay_with_their_sentence_and_an_inner_ellipsis_does_not_end_one():
    assert split("他说：“你好。”然后走了。").pieces == ("他说：“你好。”", "然后走了。")
    assert split("他想了想……然后说好。").pieces == ("他想了想……然后说好。",)
    assert split("等等……”她说。").pieces == ("等等……”", "她说。")
    assert split("价格是3.5元。Hello world. Fine!").pieces == ("价格是3.5元。", "Hello world.", "Fine!")


def test_line_breaks_split_and_are_kept_in_the_answer():
    document = split("第一句。第二句！\n\n第二段。\n最后一行")
    assert document.pieces == ("第一句。", "第二句！", "第二段。", "最后一行")
    assert document.join(["One.", "Two!", "Three.", "Last"]) == "One. Two!\n\nThree.\nLast"


def test_nonewlines_keeps_a_line_break_inside_a_sentence():
    assert split("我们明天\n去北京。好吗？", "nonewlines").pieces == ("我们明天\n去北京。", "好吗？")
    assert split("我们明天\n去北京。好吗？", "1").pieces == ("我们明天", "去北京。", "好吗？")


def test_mode_0_is_the_text_itself():
    text = "  第一句。第二句。\n"
    document = split(text, "0")
    assert document.pieces == (text,) and document.join(["answer"]) == "answer"


def test_a_text_without_readable_sentences_is_one_piece():
    assert split("。。。").pieces == ("。。。",)
    with pytest.raises(ValueError, match="split mode must be one of"):
        split("你好", "2")


def char_ends(texts):
    """A stand-in tokenizer: one token per character."""
    return [list(range(1, len(text) + 1)) for text in texts]


def test_a_sentence_longer_than_the_window_is_cut_after_clause_punctuation():
    sentence = "我们先去了北京，然后去了上海，最后回到了广州。"  # clauses of 8, 7 and 8 characters
    document = fit(split(sentence), 16, char_ends)
    assert document.pieces == ("我们先去了北京，然后去了上海，", "最后回到了广州。")
    assert document.join(["A,", "B."]) == "A, B."


def test_a_clause_longer_than_the_window_is_cut_at_the_window():
    document = fit(split("一" * 25 + "。"), 10, char_ends)
    assert [len(piece) for piece in document.pieces] == [10, 10, 6]
    assert all(len(ends) <= 10 for ends in char_ends(document.pieces))


def test_read_fits_every_mode_but_0():
    long = "一" * 30
    assert read(long, "1", 10, char_ends).pieces == ("一" * 10,) * 3
    assert read(long, "0", 10, char_ends).pieces == (long,)


sentences = st.lists(
    st.tuples(st.text(alphabet="我们你好去北京天气很", min_size=1, max_size=12), st.sampled_from("。！？")),
    min_size=1,
    max_size=8,
)
layouts = st.lists(st.sampled_from(["", " ", "\n", "\n\n"]), min_size=8, max_size=8)


@given(sentences, layouts)
def test_every_sentence_is_a_piece_and_the_layout_survives(parts, gaps):
    text = "".join(gap + body + end for (body, end), gap in zip(parts, gaps))
    document = split(text)
    assert document.pieces == tuple(body + end for body, end in parts)
    answers = [f"<{i}>" for i in range(len(document.pieces))]
    joined = document.join(answers)
    assert joined.count("\n") == sum(gap.count("\n") for gap in gaps[: len(parts)])
    assert [a for a in answers if a in joined] == answers
    # what a stream has sent at any point is the start of the answer
    for done in range(len(answers) + 1):
        assert joined.startswith(document.prefix(answers[:done], "<"[: done < len(answers)]))


# -- the engine's turns -------------------------------------------------------------------------------------


class Turns:
    """The engine's scheduler alone (serving/engine/scheduler.py): which waiting jobs join."""

    def __init__(self, max_rows: int, **settings) -> None:
        from serving.engine.scheduler import Scheduler
        from tasks.definition import EngineSettings

        self.scheduler = Scheduler(EngineSettings(max_rows=max_rows, **settings))
        self.names: dict[int, str] = {}

    def submit(self, name: str, count: int, bulk: bool = False, beams: int = 1) -> None:
        from serving.engine.job import Job

        group = object()
        for i in range(count):
            job = Job([1, 2], 4, beams, lambda tokens, final: None, group=group, bulk=bulk)
            self.names[id(job)] = f"{name}{i}"
            self.scheduler.submit(job)

    def admit(self, rows_in_use: int = 0) -> list[str]:
        return [self.names[id(job)] for job in self.scheduler.take_turns(rows_in_use, 0)]

    def join(self, running: list) -> list[str]:
        return [self.names[id(job)] for job in self.scheduler.admit(running)]


def test_requests_take_turns_so_a_short_one_is_not_queued_behind_a_document():
    turns = Turns(max_rows=4)
    turns.submit("a", 3)
    turns.submit("b", 3)
    turns.submit("c", 1)
    assert turns.admit() == ["a0", "b0", "c0", "a1"]  # first come, first served would be a0 a1 a2 b0
    assert turns.admit() == ["b1", "a2", "b2"]


@pytest.mark.parametrize("bulk_rows", [3, 8])
def test_bulk_work_yields_rows_to_interactive_requests(bulk_rows):
    alone = Turns(max_rows=256, bulk_rows_beside_interactive=bulk_rows)
    alone.submit("doc", 40, bulk=True)
    assert len(alone.admit()) == 40  # nobody waits for the rows: the document takes them all

    shared = Turns(max_rows=256, bulk_rows_beside_interactive=bulk_rows)
    shared.submit("doc", 40, bulk=True)
    shared.submit("one", 1)
    admitted = shared.admit()
    assert admitted[0] == "one0"  # interactive groups go first
    assert len(admitted) == 1 + bulk_rows


def test_a_nearly_full_batch_encodes_newcomers_together_but_an_interactive_one_joins_at_once():
    from serving.engine.job import Job

    turns = Turns(max_rows=8)
    running = [Job([1, 2], 4, 1, lambda tokens, final: None, bulk=True) for _ in range(7)]
    turns.submit("doc", 1, bulk=True)
    assert turns.join(running) == []  # 1 row free of 8: wait until a quarter is, then encode together
    assert turns.join(running[:5]) == ["doc0"]
    turns.submit("doc", 1, bulk=True)
    turns.submit("one", 1)
    assert turns.join(running) == ["one0"]  # interactive: joins now, and first


def test_a_source_wider_than_the_whole_batch_runs_alone():
    turns = Turns(max_rows=2)
    turns.submit("wide", 1, beams=4)
    assert turns.join([]) == ["wide0"]
