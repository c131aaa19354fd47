"""The continuous-batching engine against the PyTorch reference: the same tokens, whatever step a source joins
the running batch at, with mixed settings, under churn (sources cancelled while others decode), and streamed
pieces that add up to the answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from everyday import runs  # texts built from everyday sentences, when the test set is missing

from export.graphs.step_export import StepDecoder, export_step_graphs
from export.model.reference_search import ReferenceSearch
from export.training import seq2seq
from export.training.data import Pair
from serving.engine import search
from serving.engine.batch_search import block_ngrams
from serving.engine.config import EngineConfig
from serving.engine.engine import Engine, Job
from serving.engine.step_graphs import ENCODER_CALL_TOKENS, length_groups
from tasks.definition import EngineSettings

pytestmark = pytest.mark.export

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data"


class Task:
    """A checkpoint, its step graphs exported once, and sources from the test set (or the built-in list)."""

    def __init__(self, name: str, folder: Path, limit: int) -> None:
        self.model, self.config, src_tok, tgt_tok = seq2seq.load(ROOT / "checkpoints" / name)
        spec = seq2seq.TASKS[name]
        pairs = spec.reader(DATA_DIR)[1][:limit] if DATA_DIR.is_dir() else [Pair(s, "") for s in runs(limit)]
        self.sources = [s for s, _ in seq2seq.encode_pairs(pairs, src_tok, tgt_tok, spec)]
        self.graphs = export_step_graphs(self.model, folder)
        self.reference = ReferenceSearch.from_config(self.config)
        self.new_tokens = spec.max_target_tokens

    def engine(self, max_rows: int = 256) -> Engine:
        return Engine(*self.graphs, EngineConfig.from_dict(self.config), 2, EngineSettings(max_rows=max_rows))

    def expected(self, beams: int, new_tokens: int | None = None, sources: list | None = None) -> list[list[int]]:
        sources = self.sources if sources is None else sources
        out = []
        for start in range(0, len(sources), 32):
            batch = sources[start : start + 32]
            ids = torch.zeros(len(batch), max(map(len, batch)), dtype=torch.long)
            for row, source in enumerate(batch):
                ids[row, : len(source)] = torch.tensor(source)
            out += self.reference.generate(self.model, ids, (ids != 0).long(), new_tokens or self.new_tokens, beams)
        return out


class Collector:
    """on_tokens callbacks that keep every piece, to check the pieces and the final flag."""

    def __init__(self) -> None:
        self.pieces: dict[int, list[list[int]]] = {}
        self.finals: dict[int, int] = {}

    def callback(self, key: int):
        def on_tokens(tokens: list[int], finish) -> None:
            self.pieces.setdefault(key, []).append(tokens)
            self.finals[key] = self.finals.get(key, 0) + int(finish is not None)

        return on_tokens

    def tokens(self, key: int) -> list[int]:
        return [t for piece in self.pieces[key] for t in piece]


def staggered(engine: Engine, jobs: list[Job], seed: int = 0, most: int = 4, after_step=lambda: None) -> None:
    """Submit the jobs up to `most` at a time, a few steps apart, until all are done."""
    rng = np.random.default_rng(seed)
    pending = list(jobs)
    while pending or engine.busy():
        for _ in range(int(rng.integers(0, most + 1))):
            if pending:
                engine.submit(pending.pop(0))
        engine.iterate()
        after_step()


@pytest.fixture(scope="module")
def translate(tmp_path_factory):
    return Task("translate", tmp_path_factory.mktemp("translate"), limit=300)


def test_step_graphs_use_fused_attention(translate):
    encoder, decoder = (onnx.load(str(path)) for path in translate.graphs)
    cfg = translate.model.cfg
    ops = [f"{n.domain}::{n.op_type}" for n in decoder.graph.node]
    # self- and cross-attention of every decoder layer, each one fused node: the self-attention writes its cache
    # in place (GroupQueryAttention), the cross-attention reads the encoder's keys; RoPE fused on q and k
    assert ops.count("com.microsoft::GroupQueryAttention") == cfg.n_decoder_layers
    assert ops.count("com.microsoft::MultiHeadAttention") == cfg.n_decoder_layers
    assert ops.count("com.microsoft::RotaryEmbedding") == 2 * cfg.n_decoder_layers
    encoder_ops = [f"{n.domain}::{n.op_type}" for n in encoder.graph.node]
    assert encoder_ops.count("com.microsoft::MultiHeadAttention") == cfg.n_layers


def step_feeds(task: Task, beams: int) -> tuple[dict, dict]:
    """Decoder-step feeds for three sources of `beams` rows each, cross-attention once per source and once per
    row: (per source, per row)."""
    encoder, decoder = (ort.InferenceSession(str(path)) for path in task.graphs)
    sources = task.sources[:3]
    ids = np.zeros((len(sources), max(map(len, sources))), np.int32)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    mask = (ids != 0).astype(np.int32)
    encoded = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    cross = dict(zip([o.name for o in encoder.get_outputs()], encoded))
    rng = np.random.default_rng(0)
    rows, cfg = len(sources) * beams, task.model.cfg
    step = {
        "input_ids": rng.integers(4, cfg.target_vocab_size, (rows, 1)).astype(np.int32),
        "positions": rng.integers(0, 6, rows).astype(np.int64),
        **{
            i.name: rng.standard_normal((rows, cfg.n_heads, 8, cfg.head_dim)).astype(np.float32)
            for i in decoder.get_inputs()
            if i.name.startswith("past_")
        },
    }
    per_source = {**step, "cross_mask": mask, **cross}
    per_row = {**step, "cross_mask": np.repeat(mask, beams, axis=0)}
    per_row |= {name: np.repeat(array, beams, axis=0) for name, array in cross.items()}
    return per_source, per_row


def test_decoder_step_reads_cross_attention_per_source_or_per_row_alike(translate):
    """The engine feeds a source's encoder output once for all its beams while the batch has one beam width, and
    once per row when widths are mixed: both layouts must give the same step."""
    decoder = ort.InferenceSession(str(translate.graphs[1]))
    per_source, per_row = step_feeds(translate, beams=4)
    names = [o.name for o in decoder.get_outputs()]
    for name, a, b in zip(names, decoder.run(None, per_source), decoder.run(None, per_row)):
        np.testing.assert_allclose(a, b, atol=1e-4, err_msg=name)


def test_decoder_step_equals_its_pytorch_definition(translate):
    """The exported step against the same module run eagerly (SDPA): each row's new key written into its buffer
    at its position, a source's beams grouped over its cross-attention."""
    decoder = ort.InferenceSession(str(translate.graphs[1]))
    feeds, _ = step_feeds(translate, beams=2)
    with torch.no_grad():
        expected = StepDecoder(translate.model)(*(torch.from_numpy(feeds[i.name]) for i in decoder.get_inputs()))
    log_probs, present = decoder.run(["log_probs", "present_key_self_0"], feeds)
    np.testing.assert_allclose(log_probs, expected[0].numpy(), atol=1e-3)
    for row, position in enumerate(feeds["positions"]):  # a plain run returns each row's own columns
        np.testing.assert_allclose(present[row, :, : position + 1], expected[3][row, :, : position + 1], atol=1e-4)


def test_decoder_step_writes_the_cache_in_place_and_runs_in_ngc_onnxruntime(translate, ngc_ort):
    """Bound to the past's memory, the present is the same buffer with each row's new key at its position; the
    NGC image's ONNX Runtime (1.19.2) gives the same step."""
    decoder = ort.InferenceSession(str(translate.graphs[1]))
    feeds, _ = step_feeds(translate, beams=2)
    expected = decoder.run(["top_ids", "present_key_self_0"], feeds)
    ngc_top, ngc_present = ngc_ort(translate.graphs[1], feeds, ["top_ids", "present_key_self_0"])
    assert ngc_top.tolist() == expected[0].tolist()
    np.testing.assert_allclose(ngc_present, expected[1], atol=1e-5)

    binding = decoder.io_binding()
    buffers = {name: array.copy() for name, array in feeds.items() if name.startswith("past_")}
    for name, array in feeds.items():
        binding.bind_cpu_input(name, buffers.get(name, array))
    binding.bind_output("top_ids")
    for name, buffer in buffers.items():
        present = name.replace("past_", "present_")
        binding.bind_output(present, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
    decoder.run_with_iobinding(binding)
    assert binding.get_outputs()[0].numpy().tolist() == expected[0].tolist()
    written, past, positions = buffers["past_key_self_0"], feeds["past_key_self_0"], feeds["positions"]
    for row, position in enumerate(positions):  # each row's keys (its cache and the new one) as a run computes them
        np.testing.assert_allclose(written[row, :, : position + 1], expected[1][row, :, : position + 1], atol=1e-5)
    changed = (written != past).any(axis=(1, 3))  # [rows, columns]
    assert changed[np.arange(len(written)), positions].all() and changed.sum() == len(written)  # one column a row


@pytest.mark.parametrize("beams, bar", [(1, 0.99), (4, 0.95)])
def test_staggered_arrivals_give_the_reference_tokens(translate, beams, bar):
    engine, collected = translate.engine(), Collector()
    jobs = [Job(s, translate.new_tokens, beams, collected.callback(i)) for i, s in enumerate(translate.sources)]
    staggered(engine, jobs)
    expected = translate.expected(beams)
    same = sum(collected.tokens(i) == expected[i] for i in range(len(jobs)))
    assert same >= bar * len(jobs), f"{same}/{len(jobs)} identical"
    assert all(collected.finals[i] == 1 for i in range(len(jobs)))  # one final callback per source
    assert engine.stats.steps < sum(len(e) + 1 for e in expected)  # sources shared steps


def test_mixed_settings_share_one_running_batch(translate):
    """Greedy and beam 4, long and short budgets, in one batch: each source gets its own settings' answer."""
    sources = translate.sources[:40]
    settings = [(1 + 3 * (i % 2), 8 + 20 * (i % 3)) for i in range(len(sources))]  # (beams, new tokens)
    engine, collected = translate.engine(), Collector()
    jobs = [Job(s, n, b, collected.callback(i)) for i, (s, (b, n)) in enumerate(zip(sources, settings))]
    staggered(engine, jobs, seed=1)
    for i, (beams, new_tokens) in enumerate(settings):
        expected = translate.expected(beams, new_tokens, [sources[i]])[0]
        assert collected.tokens(i) == expected, (i, beams, new_tokens)
        assert len(collected.tokens(i)) <= new_tokens


def test_churn_drops_nothing_and_mixes_nothing_up(translate):
    """Sources cancelled mid-way leave at once; the others still get exactly their own answers."""
    sources = translate.sources[:60]
    cancelled = set(range(0, len(sources), 5))
    engine, collected = translate.engine(max_rows=48), Collector()
    steps = {"n": 0}
    jobs = [Job(s, translate.new_tokens, 1 + 3 * (i % 2), collected.callback(i)) for i, s in enumerate(sources)]

    def after_step() -> None:
        steps["n"] += 1
        if steps["n"] == 4:  # running, waiting or not yet submitted
            engine.cancel(jobs[i] for i in cancelled)

    staggered(engine, jobs, seed=2, most=5, after_step=after_step)
    assert set(collected.finals) == set(range(len(sources))), "every source got a final callback"
    assert all(count == 1 for count in collected.finals.values())
    greedy, beam = translate.expected(1, sources=sources), translate.expected(4, sources=sources)
    for i in set(range(len(sources))) - cancelled:
        assert collected.tokens(i) == (greedy if i % 2 == 0 else beam)[i], i
    assert engine.stats.running_rows == 0 and not engine.busy()


def test_stream_pieces_add_up_and_come_in_several_parts(translate):
    engine, collected = translate.engine(), Collector()
    sources = translate.sources[:20]
    for i, source in enumerate(sources):
        engine.submit(Job(source, translate.new_tokens, 1 + 3 * (i % 2), collected.callback(i)))
    engine.run_until_idle()
    assert all(collected.finals[i] == 1 for i in range(len(sources)))
    multi = [i for i in range(len(sources)) if len(collected.tokens(i)) > 3]
    assert multi and all(len([p for p in collected.pieces[i] if p]) >= 2 for i in multi if i % 2 == 0)


def _cheapest_cut(lengths: list[int], call_cost: int) -> float:
    """Brute force over every way to cut the sorted lengths into runs."""
    ordered, best = sorted(lengths), float("inf")
    for mask in range(2 ** (len(ordered) - 1)):
        cuts = [0] + [i + 1 for i in range(len(ordered) - 1) if mask >> i & 1] + [len(ordered)]
        best = min(best, sum(call_cost + (b - a) * ordered[b - 1] for a, b in zip(cuts, cuts[1:])))
    return best


def test_length_groups_cost_least_and_cover_every_source_once():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(1, 64, size=int(rng.integers(1, 9))).tolist()
        call_cost = int(rng.integers(0, 80))
        groups = length_groups(lengths, call_cost)
        assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
        paid = sum(call_cost + len(group) * max(lengths[i] for i in group) for group in groups)
        assert paid == _cheapest_cut(lengths, call_cost), (lengths, call_cost, groups)
    assert length_groups([12, 10, 11, 13], 32) == [[1, 2, 0, 3]]  # similar lengths: one call
    assert length_groups([9, 60, 8, 10, 11, 9, 12, 10], 32) == [[2, 0, 5, 3, 7, 4, 6], [1]]


def test_a_long_source_gets_its_own_encoder_call_and_the_same_tokens(translate):
    engine, collected, shapes = translate.engine(), Collector(), []
    run = engine.graphs.encoder.run

    def counted(names, feeds):
        shapes.append(feeds["input_ids"].shape)
        return run(names, feeds)

    engine.graphs.encoder = type("Counted", (), {"run": staticmethod(counted)})()
    by_length = sorted(translate.sources, key=len)
    sources = by_length[:7] + by_length[-1:]  # seven short sources and the longest
    assert len(sources[-1]) - len(sources[-2]) > ENCODER_CALL_TOKENS // 2
    for i, source in enumerate(sources):
        engine.submit(Job(source, translate.new_tokens, 1 + 3 * (i % 2), collected.callback(i)))
    engine.run_until_idle()
    assert sorted(shapes) == [(1, len(sources[-1])), (7, len(sources[-2]))]
    for i, source in enumerate(sources):
        assert collected.tokens(i) == translate.expected(1 + 3 * (i % 2), sources=[source])[0], i


def test_sources_joining_and_leaving_keep_the_cross_attention_buffers(translate):
    """A newcomer's encoder output goes into its own row and a finished source's row is taken by another: the
    cross-attention buffers are replaced only when they must grow (or narrow), not at each join or leave."""
    engine, collected = translate.engine(), Collector()
    sources = translate.sources[:120]
    jobs = [Job(s, translate.new_tokens, 1, collected.callback(i)) for i, s in enumerate(sources)]
    buffers, seen = [], {"running": [], "changed": 0}

    def after_step():
        if not buffers or buffers[-1] is not engine.batch.cross[0]:
            buffers.append(engine.batch.cross[0])
        running = [id(job) for job in engine.batch.jobs]
        seen["changed"] += running != seen["running"]  # a source joined or left
        seen["running"] = running

    staggered(engine, jobs, seed=4, after_step=after_step)
    assert seen["changed"] > 40
    assert len(buffers) <= seen["changed"] // 5, (len(buffers), seen["changed"])
    expected = translate.expected(1, sources=sources)
    assert all(collected.tokens(i) == expected[i] for i in range(len(sources)))


def test_a_newcomers_first_token_is_reported_before_the_running_sources(translate):
    """The step that gives a source its first token reports it first: that is what its streaming client waits for,
    while the others' next tokens are a step's worth of latency among many."""
    engine, order = translate.engine(), []
    running = [
        Job(source, translate.new_tokens, 1, lambda tokens, final, i=i: order.append(i))
        for i, source in enumerate(translate.sources[:3])
    ]
    for job in running:
        engine.submit(job)
    engine.iterate()
    engine.iterate()
    order.clear()
    engine.submit(Job(translate.sources[3], translate.new_tokens, 1, lambda tokens, final: order.append("new")))
    engine.iterate()
    assert order[0] == "new" and len(order) > 1, order


def test_a_failed_step_answers_its_jobs_with_the_error_and_the_engine_goes_on(translate, monkeypatch):
    """A step that raises ends the running jobs with the error (none hangs), and the next jobs are served as if
    nothing had happened; a job whose own callback raises leaves alone."""
    engine, collected, errors = translate.engine(), Collector(), {}
    sources = translate.sources[:6]

    def job(i: int, on_tokens=None) -> Job:
        return Job(sources[i], translate.new_tokens, 1 + 3 * (i % 2), on_tokens or collected.callback(i),
                   on_error=lambda message, i=i: errors.setdefault(i, message))  # fmt: skip

    real_run = engine.graphs.decoder.run_with_iobinding
    calls = {"n": 0}

    def failing_second_step(binding):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of memory (injected)")
        return real_run(binding)

    monkeypatch.setattr(engine.graphs.decoder, "run_with_iobinding", failing_second_step)
    engine.submit(job(0))
    engine.submit(job(1))
    engine.run_until_idle()
    assert set(errors) == {0, 1} and all("out of memory (injected)" in m for m in errors.values()), errors
    assert engine.stats.running_rows == 0 and not engine.busy()

    def broken_callback(tokens, final):
        raise ValueError("cannot render (injected)")

    for i in (2, 3, 4):
        engine.submit(job(i))
    engine.submit(job(5, broken_callback))
    engine.run_until_idle()
    assert "cannot render (injected)" in errors[5]
    greedy, beam = translate.expected(1, sources=sources), translate.expected(4, sources=sources)
    for i in (2, 3, 4):
        assert i not in errors and collected.finals[i] == 1
        assert collected.tokens(i) == (greedy if i % 2 == 0 else beam)[i], i


def test_a_failure_without_on_error_raises(translate, monkeypatch):
    """Offline callers that give no on_error see the exception, as before."""
    engine = translate.engine()
    monkeypatch.setattr(
        engine.graphs.decoder, "run_with_iobinding", lambda binding: (_ for _ in ()).throw(MemoryError())
    )
    engine.submit(Job(translate.sources[0], 8, 1, lambda tokens, final: None))
    with pytest.raises(MemoryError):
        engine.run_until_idle()
    assert not engine.busy()


def test_summarizer_with_copy_pointer_and_ngram_blocking(tmp_path):
    task = Task("summarize", tmp_path, limit=40)
    engine, collected = task.engine(), Collector()
    jobs = [Job(s, task.new_tokens, 1 + 3 * (i % 2), collected.callback(i)) for i, s in enumerate(task.sources)]
    staggered(engine, jobs, seed=3)
    greedy, beam = task.expected(1), task.expected(4)
    same = sum(collected.tokens(i) == (greedy if i % 2 == 0 else beam)[i] for i in range(len(jobs)))
    assert same >= 0.95 * len(jobs), f"{same}/{len(jobs)}"


def test_ngram_blocking_reads_the_top_tokens_unless_too_many_of_them_are_blocked(translate):
    """With n-gram blocking the engine keeps reading each row's TOP_K best tokens, blocked ones set to the lowest
    score; a step where a row has more blocked among them than its search could spare gets all log-probabilities."""
    engine = translate.engine()
    n = engine.decoding.no_repeat_ngram_size
    assert n >= 2  # the shipped translate checkpoint blocks repeated n-grams
    prefix = [7] * (n - 1)  # the last n-1 tokens; every token that once followed them is blocked
    followers = list(range(100, 116))

    def row_with(blocked: int) -> list[int]:
        history = [token for follower in followers[:blocked] for token in (*prefix, follower)]
        return [engine.decoding.bos_id, *history, *prefix]

    def step(blocked: int):
        job = Job(row_with(blocked), 10, 1, lambda tokens, final: None)
        job.sequence = search.SourceSearch(engine.decoding, 10, 1)
        job.sequence.beams = [job.source]
        top_scores = np.arange(0.0, -16.0, -1.0, dtype=np.float32)[None, :]
        top_ids = np.array([followers], dtype=np.int64)
        log_probs = np.full((1, engine.layout.vocab), -30.0, dtype=np.float32)
        return block_ngrams([job], n, top_scores.copy(), top_ids, lambda: log_probs)

    scores, ids = step(blocked=2)  # a greedy row can spare 14 of its 16
    assert ids is not None and ids[0].tolist() == followers
    assert scores[0, :2].tolist() == [search.LOWEST] * 2 and scores[0, 2] == -2.0

    scores, ids = step(blocked=15)
    assert ids is None and scores.shape == (1, engine.layout.vocab)  # all log-probabilities, the blocked ones lowest
    assert (scores[0, followers[:15]] == search.LOWEST).all() and scores[0, followers[15]] == -30.0
