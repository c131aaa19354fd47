"""The engine's parts alone, without a model: the running batch's rows and buffers (serving/engine/batch.py), one
step of every source's search (batch_search.py) and the delivery of a step's outputs (job.py). The whole engine
against the PyTorch reference is tests/test_engine.py."""

from __future__ import annotations

import numpy as np
import pytest

from serving.engine.batch import CROSS_COLUMNS_STEP, RunningBatch
from serving.engine.batch_search import force_eos, take_step
from serving.engine.job import Job, Output
from serving.engine.sampling import Sampling, sample
from serving.engine.search import Decoding, Finish, SourceSearch
from tasks.generation_contract import Layout

LAYOUT = Layout(n_layers=1, n_cross=1, n_heads=1, head_dim=1, vocab=50, top_k=16)
DECODING = Decoding(bos_id=1, eos_id=2)


def job(source_length: int, beams: int = 1, max_new_tokens: int = 20, sampling: Sampling | None = None) -> Job:
    new = Job([5] * (source_length - 1) + [2], max_new_tokens, beams, lambda tokens, final: None, sampling=sampling)
    new.sequence = SourceSearch(DECODING, max_new_tokens, beams, sampling=sampling)
    return new


def unread() -> np.ndarray:
    raise AssertionError("a step without sampled rows read every log-probability")


def encode_marking(batch: RunningBatch, calls: list):
    """Writes each source's length into its cross-attention row, as the encoder's output would go there."""

    def encode_into(jobs: list[Job], first_row: int) -> None:
        sources = [job.source for job in jobs]
        calls.append((len(sources), first_row))
        for i, source in enumerate(sources):
            for buffer in batch.cross:
                buffer[first_row + i, :, : len(source)] = len(source)
            batch.cross_mask[first_row + i, : len(source)] = 1

    return encode_into


def test_newcomers_take_the_rows_after_the_running_ones_and_are_encoded_there():
    batch, calls = RunningBatch(LAYOUT), []
    encode = encode_marking(batch, calls)
    batch.join([job(3), job(4)], encode)
    batch.join([job(5, beams=2)], encode)
    assert calls == [(2, 0), (1, 2)]
    assert batch.rows == 4 and batch.starts().tolist() == [0, 1, 2, 4]
    assert [int(batch.cross[0][row, 0, 0, 0]) for row in range(3)] == [3, 4, 5]
    assert batch.cross_mask[:3].sum(axis=1).tolist() == [3, 4, 5]


def test_a_decoder_only_batch_prefills_each_newcomers_beam_rows_and_copies_its_prompts_columns():
    """No cross-attention: a newcomer's fill starts at its first row (beams counted), and a beam reorder copies the
    prompt's cached keys as well as the generated ones."""
    layout = Layout(n_layers=1, n_cross=0, n_heads=1, head_dim=1, vocab=50, top_k=16)
    batch, calls = RunningBatch(layout), []
    prompt = [7, 8, 9, 10, 11]
    jobs = [Job(prompt, 20, beams, lambda tokens, final: None) for beams in (2, 3)]
    for new in jobs:
        new.sequence = SourceSearch(DECODING, 20, new.num_beams, prefix=new.source)

    def prefill(admitted: list[Job], first_row: int) -> None:
        calls.append(([len(j.source) for j in admitted], first_row))
        for row, cache in enumerate(batch.caches_for(rows=first_row + 5, columns=6)[0]):
            cache[:, :6] = row

    batch.join(jobs[:1], prefill)
    batch.join(jobs[1:], prefill)
    assert calls == [([5], 0), ([5], 2)] and batch.rows == 5
    second = jobs[1].state
    second.steps = 1
    assert second.cached_columns == len(prompt)  # the prompt's first 4 tokens and the token fed at step 1
    jobs[0].state.steps = 1
    batch.leave(set(), parents=[[0, 1], [2, 2, 0]])
    batch.join([], prefill)
    assert batch.caches[0][2:5, 0, : len(prompt), 0].tolist() == [[4] * 5, [4] * 5, [2] * 5]


def test_a_search_with_a_prompt_answers_only_what_it_generated():
    search = SourceSearch(Decoding(bos_id=1, eos_id=2, other_eos_ids=(3,)), 10, 1, prefix=[7, 8, 9])
    assert search.take_token(20) == [0] and search.stable_tokens() == [20]
    assert search.take_token(3) == [] and search.result == [20] and search.finish is Finish.EOS  # another eos
    beams = SourceSearch(Decoding(bos_id=1, eos_id=2, length_penalty=1.0), 10, 2, prefix=[7, 8, 9])
    assert beams.hypotheses.uncounted == 2  # a hypothesis is scored by its generated tokens plus its eos


def test_a_finished_source_leaves_its_place_to_the_last_one_and_only_moved_rows_are_copied():
    batch, calls = RunningBatch(LAYOUT), []
    encode = encode_marking(batch, calls)
    jobs = [job(length) for length in (3, 4, 5, 6)]
    batch.join(jobs, encode)
    caches = batch.caches_for(rows=4, columns=2)
    for row, cache in enumerate(caches[0]):
        cache[:, :2] = 10 + row  # row r's keys
    for j in jobs:
        j.state.steps = 2
    batch.leave({1}, parents=[[0], [], [0], [0]])  # the second source finished
    assert batch.jobs == [jobs[0], jobs[3], jobs[2]]  # the last filled the hole; the others stayed put
    batch.join([], encode)
    assert batch.caches[0][:3, 0, :2, 0].tolist() == [[10, 10], [13, 13], [12, 12]]
    assert [int(batch.cross[0][row, 0, 0, 0]) for row in range(3)] == [3, 6, 5]


def test_a_beam_reorder_copies_the_rows_it_continues():
    batch = RunningBatch(LAYOUT)
    beam = job(3, beams=3)
    batch.join([beam], encode_marking(batch, []))
    for row, cache in enumerate(batch.caches_for(rows=3, columns=1)[0]):
        cache[:, 0] = row
    beam.state.steps = 1
    batch.leave(set(), parents=[[2, 2, 0]])  # next step: two beams continue row 2, one row 0
    batch.join([], encode_marking(batch, []))
    assert batch.caches[0][:3, 0, 0, 0].tolist() == [2, 2, 0]


def test_the_cross_attention_buffers_are_replaced_only_to_grow_or_narrow():
    batch = RunningBatch(LAYOUT)
    encode = encode_marking(batch, [])
    batch.join([job(3)], encode)
    first = batch.cross[0]
    batch.join([job(CROSS_COLUMNS_STEP)], encode)  # still fits
    assert batch.cross[0] is first
    batch.join([job(CROSS_COLUMNS_STEP + 1)], encode)  # wider: one step of columns more
    assert batch.cross[0].shape[2] == 2 * CROSS_COLUMNS_STEP
    assert [int(batch.cross[0][row, 0, 0, 0]) for row in range(3)] == [3, CROSS_COLUMNS_STEP, CROSS_COLUMNS_STEP + 1]
    batch.leave({1, 2}, parents=[[0], [], []])
    batch.join([], encode)  # the running source fits in half: narrowed
    assert batch.cross[0].shape[2] == CROSS_COLUMNS_STEP and int(batch.cross[0][0, 0, 0, 0]) == 3


def test_mixed_beam_widths_read_the_cross_attention_once_per_row():
    batch = RunningBatch(LAYOUT)
    batch.join([job(3, beams=1), job(4, beams=2)], encode_marking(batch, []))
    mask, (keys, _) = batch.cross_per_row()
    assert mask.sum(axis=1).tolist() == [3, 4, 4] and keys[:, 0, 0, 0].tolist() == [3, 4, 4]


def test_a_step_of_greedy_and_beam_sources_takes_each_its_best():
    greedy, beam = job(3), job(3, beams=2)
    scores = np.full((3, 4), -10.0, np.float32)
    ids = np.tile(np.arange(10, 14), (3, 1))
    scores[0, 2] = -0.1  # greedy: token 12
    scores[1, 1], scores[1, 3] = -0.2, -0.3  # the beam's first step reads its row 0 only
    parents = take_step([greedy, beam], DECODING, LAYOUT.vocab, scores, ids, np.array([0, 1, 3]), unread)
    assert parents == [[0], [0, 0]]
    assert greedy.state.beams == [[1, 12]]
    assert beam.state.beams == [[1, 11], [1, 13]]


def test_the_last_step_may_only_end_where_the_checkpoint_says_so():
    last = job(3, max_new_tokens=2)
    last.state.steps = 1
    scores, ids = np.zeros((1, 4), np.float32), np.tile(np.arange(10, 14), (1, 1))
    force_eos([last], DECODING.eos_id, scores, ids, [0])
    assert ids[0, 0] == DECODING.eos_id and scores[0, 0] == 0.0 and (scores[0, 1:] < -1e30).all()
    take_step([last], DECODING, LAYOUT.vocab, scores, ids, np.array([0, 1]), unread)
    assert last.state.finish is Finish.EOS


def test_a_callback_that_raises_fails_its_job_not_the_step():
    errors = []

    def broken(tokens, final):
        raise ValueError("cannot render")

    told = Job([2], 4, 1, broken, on_error=errors.append)
    Output(told, [7]).deliver()
    assert told.failed and errors == ["answering failed: cannot render"]
    untold = Job([2], 4, 1, broken)
    with pytest.raises(ValueError):
        Output(untold, [7], Finish.LENGTH).deliver()


def test_a_failed_step_reaches_the_job_as_an_error_output():
    errors, tokens = [], []
    job = Job([2], 4, 1, lambda new, final: tokens.append(new), on_error=errors.append)
    Output(job, [], Finish.ERROR, "generation failed: out of memory").deliver()
    assert errors == ["generation failed: out of memory"] and job.failed and tokens == []


def sampled_tokens(sampling: Sampling, log_probs: np.ndarray, steps: int = 40) -> list[int]:
    sampled = job(3, max_new_tokens=steps, sampling=sampling)
    for _ in range(steps):
        scores, ids = np.sort(log_probs)[None, ::-1][:, :16].copy(), np.argsort(-log_probs)[None, :16].copy()
        if not take_step([sampled], DECODING, LAYOUT.vocab, scores, ids, np.array([0, 1]), lambda: log_probs[None]):
            break
    return sampled.state.beams[0][1:]


def test_a_seeded_sampled_source_repeats_and_another_seed_does_not():
    rng = np.random.default_rng(0)
    log_probs = np.log(rng.dirichlet(np.ones(LAYOUT.vocab))).astype(np.float32)
    log_probs[DECODING.eos_id] = -np.inf  # it never ends early
    first = sampled_tokens(Sampling(seed=7), log_probs)
    assert sampled_tokens(Sampling(seed=7), log_probs) == first and len(first) == 40
    assert sampled_tokens(Sampling(seed=8), log_probs) != first
    assert len(set(first)) > 10  # drawn, not argmax


def logs(probs: list[float]) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.array(probs)).astype(np.float32)


def test_top_k_one_is_greedy_and_top_p_keeps_the_likeliest_that_reach_it():
    log_probs = logs([0.05, 0.0, 0.0, 0.5, 0.3, 0.15])
    assert {sample(log_probs, [], Sampling(top_k=1, seed=s), np.random.default_rng(s)) for s in range(20)} == {3}
    drawn = {sample(log_probs, [], Sampling(top_p=0.75, seed=s), np.random.default_rng(s)) for s in range(200)}
    assert drawn == {3, 4}  # 0.5 + 0.3 reach 0.75; 0.15 and 0.05 are cut
    drawn = {sample(log_probs, [], Sampling(top_k=3), np.random.default_rng(s)) for s in range(300)}
    assert drawn == {3, 4, 5}


def test_the_repetition_penalty_and_temperature_shape_the_draw():
    log_probs = logs([0.0, 0.0, 0.0, 0.6, 0.4])
    draws = lambda sampling, seen: [  # noqa: E731
        sample(log_probs, seen, sampling, np.random.default_rng(s)) for s in range(400)
    ]
    plain = draws(Sampling(), []).count(3)
    penalized = draws(Sampling(repetition_penalty=3.0), [3]).count(3)
    cold = draws(Sampling(temperature=0.2), []).count(3)
    assert penalized < plain < cold  # a seen token less likely; a low temperature sharpens
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=1.5)
