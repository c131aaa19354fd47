"""The benchmark harness: a tiny run writes sane JSON, Markdown and PNGs; a run without data says what it lacks."""

from __future__ import annotations

import importlib
import json
import math
import os
import time
import tomllib

import pytest

from benchmarks import (
    checks,
    closed_loop,
    cpu_share,
    data,
    generation,
    queue_policy,
    report,
    run,
    runtime,
    serving,
    streams,
    threads,
    translation,
    translation_offline,
    translation_report,
    variant_repository,
)
from benchmarks.ctranslate2_baseline import read_test_sentences
from benchmarks.onnx_variants import rope_path_nodes
from benchmarks.profiles import REPOSITORY, SECTIONS, profile
from benchmarks.stats import summarize
from benchmarks.variant_repository import ServingVariant, rewrite_config
from export.training import seq2seq
from export.training.data import read_sentiment
from loadtest.texts import load_texts
from serving.frontends.base import SEND_AFTER_EXECUTE
from serving.frontends.options import check_options
from serving.ort_backend.session_config import available_cpus

CONFIG = """name: "sentiment"
max_batch_size: 64
dynamic_batching {
  default_queue_policy { max_queue_size: 16 timeout_action: REJECT }
}
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


def rewritten(variant: ServingVariant, text: str = CONFIG):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(rewrite_config(text, variant), model_config_pb2.ModelConfig())


def groups(config) -> list[tuple[int, int]]:
    return [(group.count, group.kind) for group in config.instance_group]


def test_variant_config_drops_batching_and_sets_instances():
    config = rewritten(ServingVariant(batching=False, instances=1))
    assert not config.HasField("dynamic_batching") and config.max_batch_size == 64
    assert groups(config) == [(1, config.instance_group[0].KIND_CPU)]


def test_variant_config_keeps_batching_with_a_raised_queue_limit():
    with_threads = CONFIG + 'parameters { key: "intra_op_thread_count", value: { string_value: "1" } }\n'
    config = rewritten(ServingVariant(batching=True, instances=2), with_threads)
    assert config.dynamic_batching.default_queue_policy.max_queue_size > 16
    assert [count for count, _ in groups(config)] == [2]


def test_variant_instances_share_the_cores_without_oversubscribing():
    with_threads = CONFIG + 'parameters { key: "intra_op_thread_count", value: { string_value: "1" } }\n'

    def threads(instances: int) -> int:
        config = rewritten(ServingVariant(instances=instances), with_threads)
        return int(config.parameters["intra_op_thread_count"].string_value)

    assert threads(1) == available_cpus()  # one instance gets every core
    for instances in (2, 3, 2 * available_cpus()):
        assert threads(instances) >= 1
        assert instances * threads(instances) <= max(instances, available_cpus()), instances


def test_rope_path_is_excluded_from_quantization():
    import onnx

    model = onnx.load(str(REPOSITORY / "sentiment_encoder" / "1" / "model.onnx"))
    excluded = set(rope_path_nodes(model))
    rotary = {node.name for node in model.graph.node if node.op_type == "RotaryEmbedding"}
    assert rotary and rotary <= excluded
    assert not any(node.op_type == "MatMul" for node in model.graph.node if node.name in excluded)


def _finite_positive(summary: dict) -> bool:
    return summary["n"] >= 1 and all(math.isfinite(v) and v > 0 for v in summary["values"])


@pytest.mark.server
def test_smoke_run_writes_results(tmp_path, fake_data_dir):
    argv = ["--smoke", "--out", str(tmp_path), "--name", "smoke", "--data-dir", str(fake_data_dir)]
    assert run.main(argv) == 0
    results = json.loads((tmp_path / "smoke.json").read_text(encoding="utf-8"))
    assert set(results) >= {"meta", "ceiling", "runtime", "generation", "serving", "translation", "documents", "checks"}
    assert len(results["meta"]["load_start"]) == 3 and len(results["meta"]["load_end"]) == 3

    for shape in results["runtime"]["shapes"]:
        bases = ("pytorch_eager", "ort_decomposed", "ort_fused", "ort_int8")
        names = {base + suffix for base in bases for suffix in ("", "_1thread")}
        assert set(shape["sequences_per_s"]) == names
        assert all(_finite_positive(s) for s in shape["sequences_per_s"].values())
    accuracy = results["runtime"]["accuracy"]
    assert all(0.5 < accuracy[name] <= 1.0 for name in ("pytorch_eager", "ort_fused", "ort_int8"))
    assert accuracy["ort_fused"] == pytest.approx(accuracy["pytorch_eager"], abs=0.05)

    for row in results["generation"]["rows"]:
        assert all(_finite_positive(s) for s in row["sentences_per_s"].values())
        assert all(count > 0 for count in row["generated_tokens"].values())

    for point in results["serving"]["points"]:
        assert set(point["async_client"]) == set(point["perf_analyzer"]) | {"fastapi_pytorch"}
        for cells in (point["perf_analyzer"], point["async_client"]):
            for cell in cells.values():
                assert _finite_positive(cell["throughput"])
                assert cell["p50_ms"]["median"] <= cell["p99_ms"]["median"]
        assert all(cell["errors"]["median"] == 0 for cell in point["async_client"].values())
    assert results["serving"]["raw_ort"]["ort_p50_ms"] > 0
    assert all(_finite_positive(s) for s in results["serving"]["raw_ort_batches"].values())
    share = results["serving"]["cpu_share"]
    served, bls = share[serving.REFERENCE], share[serving.BLS_ENCODER.name]
    assert _finite_positive(served["throughput"]) and served["cores"]["tritonserver"]["median"] > 0
    idle = {"median": 0.0}
    # the served front model runs the encoder itself: only the BLS variant keeps the encoder's stub busy
    assert (
        bls["cores"]["stub sentiment_encoder"]["median"] > served["cores"].get("stub sentiment_encoder", idle)["median"]
    )
    assert results["ceiling"]["matmul_gflops"]["median"] > 0
    assert all(0 < f["fraction_of_ceiling"] for f in results["ceiling"]["fractions"])
    assert {c["name"].split(":")[0] for c in results["checks"]}  # the bars were evaluated
    assert all(isinstance(c["met"], bool) for c in results["checks"])
    bars = results["translation"]["bars"]
    assert len(bars) == 8 and all(c in results["checks"] for c in bars)  # listed with the other bars
    for point in results["translation"]["served"]:  # the engine's stubs and the client threads did the work
        engine = point["servers"][translation.ENGINE_SERVER]
        assert engine[f"{closed_loop.CORES}stub translate"]["median"] > 0
        assert engine[f"{closed_loop.CORES}{closed_loop.LOAD}"]["median"] > 0
        assert engine["answer_words_p50"]["median"] > 0  # the answers were read, not only timed
    certain = {s["beams"]: s["certain_text"] for s in results["translation"]["streaming"]}
    assert certain[1]["first_text_step_p50"] == 1  # greedy's first token is certain at once
    for c in certain.values():
        assert 0 < c["first_text_share_p50"] <= 1 and c["first_text_step_p50"] <= c["steps_p50"]

    documents = results["documents"]
    assert len(documents["bars"]) == 5 and all(c in results["checks"] for c in documents["bars"])
    for point in documents["served"]:  # the paragraphs were split into sentences and answered
        for name in ("paragraphs", "singles"):  # overload refusals are retried as the SDK does; errors are faults
            assert point[name]["errors"]["median"] == 0, point[name].get("first_error")
        assert _finite_positive(point["paragraphs"]["sentences_per_s"])
    assert documents["pieces_per_paragraph"] >= documents["sentences_per_paragraph"]
    fairness = documents["fairness"]
    assert fairness["documents"]["requests"] > 0
    assert fairness["loaded"]["errors"] == 0, fairness["loaded"].get("first_error")

    llm = results["llm"]  # every runtime generated, from the same prompt ids, and the bars were listed
    assert {row["runtime"].split()[0] for row in llm["offline"]} == {"ours", "ctranslate2", "genai"}
    assert all(row["tokens_per_s"] > 0 and row["rss_mb"] > 0 for row in llm["offline"])
    assert all("ttft_ms" in row for row in llm["offline"] if row["batch"] == 1)
    assert len(llm["bars"]) == 2 and all(c in results["checks"] for c in llm["bars"])

    gateway = results["gateway"]  # the same requests through the gateway and straight over gRPC, paired
    assert len(gateway["bars"]) == 4 and all(c in results["checks"] for c in gateway["bars"])
    assert {p["side"] for p in gateway["points"]} >= {"straight over gRPC", "gateway /v2/translate"}
    for point in gateway["points"]:
        assert point["errors"]["median"] == 0 and _finite_positive(point["throughput"])

    markdown = (tmp_path / "smoke.md").read_text(encoding="utf-8")
    headings = (
        "## 1. Model runtime",
        "## 2. Generation",
        "## 3–4. Serving",
        "## 5. Ceiling",
        "## 6. Translation",
        "## 7. Documents",
        "## Gateway (DeepL / JSON over HTTP) against straight gRPC",
    )
    for heading in (*headings, "**Where the time goes", "**Where the CPU goes", "## Bars"):
        assert heading in markdown
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == [
        f"smoke_{kind}.png" for kind in ("latency_percentiles", "speedup_per_layer", "throughput_vs_concurrency")
    ]
    assert all((tmp_path / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_unknown_section_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        run.main(["--sections", "runtime,bogus"])
    assert "unknown sections ['bogus']" in capsys.readouterr().err


def test_served_variant_keeps_the_committed_settings():
    config = rewritten(ServingVariant())
    assert config.HasField("dynamic_batching") and [count for count, _ in groups(config)] == [2]
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size > 16 and policy.timeout_action == policy.REJECT  # only the limit is raised


def test_variant_without_queue_policy_keeps_batching():
    config = rewritten(ServingVariant(queue_policy=False))
    assert config.HasField("dynamic_batching") and not config.dynamic_batching.HasField("default_queue_policy")


def test_train_step_benchmark_prints_both_modes(capsys):
    from benchmarks import train_step

    assert train_step.main(["--threads", "1", "--repeats", "1"]) == 0
    line = capsys.readouterr().out
    assert "fp32" in line and "bf16" in line and "speed-up" in line


def test_missing_data_is_listed_file_by_file_before_the_run(tmp_path):
    lines = data.plan(tmp_path, SECTIONS)
    listed = {line.split(": ")[0].removeprefix("missing ") for line in lines}
    assert listed == {str(tmp_path / name) for names in data.FILES.values() for name in names}
    waimai = next(line for line in lines if "waimai_10k.csv" in line)
    assert "runtime reads it" in waimai and "accuracy is not measured" in waimai and "serving reads it" in waimai
    assert data.plan(tmp_path, ["ceiling"]) == []  # only the sections that run are checked


def test_the_listed_files_are_the_ones_the_readers_open(fake_data_dir, tmp_path_factory):
    readers = {
        "sentiment": read_sentiment,
        "translate_test": read_test_sentences,
        **{task: spec.reader for task, spec in seq2seq.TASKS.items()},
    }
    for dataset, names in data.FILES.items():
        copy = tmp_path_factory.mktemp(dataset)
        for name in names:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((fake_data_dir / name).read_bytes())
        readers[dataset](copy)  # the listed files suffice
        for name in names:  # and each one is needed
            held = (copy / name).rename(copy / "held")
            with pytest.raises(FileNotFoundError):
                readers[dataset](copy)
            held.rename(copy / name)


def test_sections_without_data_measure_on_built_in_texts_or_say_why_not(tmp_path):
    prof = profile("smoke", tmp_path)
    built_in = load_texts(None)[0]  # the load test's texts for a run without data
    assert runtime.accuracy({}, None, 0, prof) == {"not_measured": f"no data at {tmp_path / 'sentiment'}"}
    assert serving.request_texts(prof) == (built_in["sentiment"], data.BUILT_IN)
    pairs, source = generation.source_pairs("summarize", prof, len(built_in["summarize"]) + 1)
    assert [p.source for p in pairs] == [*built_in["summarize"], built_in["summarize"][0]]
    assert source == data.BUILT_IN
    sentences, source = translation.test_sentences(prof)
    assert sentences == data.fallback_texts("translate", prof.translation_sentences) and source == data.BUILT_IN


def test_report_without_sentiment_data_says_accuracy_was_not_measured(tmp_path):
    names = [runtime.EAGER, runtime.DECOMPOSED, runtime.FUSED, runtime.INT8]
    rates = {name + suffix: summarize([100.0]) for name in names for suffix in ("", threads.ONE_THREAD_SUFFIX)}
    section = {
        "shapes": [{"batch": 8, "sequence": 128, "sequences_per_s": rates}],
        "variants": {runtime.INT8: {"excluded_from_quantization": []}},
        "accuracy": runtime.accuracy({}, None, 0, profile("smoke", tmp_path)),
    }
    missing = data.plan(tmp_path, ["runtime"])
    meta = {
        "name": "no-data",
        "command": "python -m benchmarks",
        "started": "2025-01-01T00:00:00+00:00",
        "seconds": 1.0,
        "machine": {"cpus_usable": 2, "torch": "?", "onnxruntime": "?"},
        "load_start": [0, 0, 0],
        "load_end": [0, 0, 0],
        "profile": {"name": "smoke", "repetitions": 1},
        "data": {"dir": str(tmp_path), "missing": missing},
    }
    results = {"meta": meta, "runtime": section}
    results["checks"] = checks.evaluate(results)
    assert [c["name"] for c in results["checks"] if "accuracy" in c["name"]] == []
    markdown = report.markdown(results)
    assert f"not measured (no data at {tmp_path / 'sentiment'})" in markdown
    assert all(f"- data: {line}" in markdown for line in missing)


def test_the_served_share_divides_the_top_concurrency_by_the_better_raw_batch_32_rate():
    rates = {runtime.FUSED: summarize([2000.0]), runtime.FUSED + threads.ONE_THREAD_SUFFIX: summarize([1500.0])}
    served = [(1, 300.0), (32, 1300.0), (8, 1100.0)]
    results = {
        "runtime": {"shapes": [{"batch": 32, "sequence": 32, "sequences_per_s": rates}]},
        "serving": {
            "points": [
                {"concurrency": c, "perf_analyzer": {serving.REFERENCE: {"throughput": summarize([rate])}}}
                for c, rate in served
            ]
        },
    }
    (share,) = checks._served_share_checks(results)
    assert share["value"] == pytest.approx(1300 / 2000) and share["met"] and "c=32" in share["name"]
    assert checks._served_share_checks({"runtime": results["runtime"]}) == []  # no serving section: no check
    results["serving"]["raw_ort_batches"] = {"all_cores": summarize([2400.0]), "1thread": summarize([2600.0])}
    same_texts = checks._served_share_checks(results)[1]
    assert same_texts["value"] == pytest.approx(1300 / 2600) and not same_texts["met"]


# -- the translation section: the previous served setup as a variant repository, ratios and bars ---------------


def _fake_translate_repository(root):
    """A repository with the committed translate and translate_generator configs and definition, and stand-ins
    for their graphs."""
    for relative in (
        "translate/config.pbtxt",
        "translate/1/translate.toml",
        "translate/1/model.py",
        "translate_generator/config.pbtxt",
        "translate_generator/configs/cpu.pbtxt",
    ):
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPOSITORY / relative).read_bytes())
    (root / "translate/1/encoder.onnx").write_bytes(b"onnx")
    (root / "translate_generator/1").mkdir(parents=True)
    (root / "translate_generator/1/model.onnx").write_bytes(b"onnx")
    return root


def test_translation_variant_serves_translate_on_the_beamsearch_op(tmp_path):
    from serving.frontends.base import read_endpoint

    source = _fake_translate_repository(tmp_path / "source")
    originals = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    repo = variant_repository.build_translate_variant(tmp_path / "out", repository=source)
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == originals  # the source is untouched

    _, served = read_endpoint(source / "translate" / "1", "translate")
    _, endpoint = read_endpoint(repo / "translate" / "1", "translate")  # as the front model reads it
    assert served.front != variant_repository.GENERATION_FRONT and endpoint.front == variant_repository.GENERATION_FRONT
    assert endpoint.models["generator"].name == variant_repository.GENERATOR_MODEL
    before = tomllib.loads((source / "translate/1/translate.toml").read_text(encoding="utf-8"))
    after = tomllib.loads((repo / "translate/1/translate.toml").read_text(encoding="utf-8"))
    before["endpoint"].pop("front"), after["endpoint"].pop("front")
    split = variant_repository.SPLIT_OPTION
    assert before["options"].pop(split) and split not in after["options"]
    assert after == before  # nothing else changed
    for relative in ("translate/config.pbtxt", "translate_generator/config.pbtxt"):
        assert (repo / relative).read_bytes() == (source / relative).read_bytes()
    assert (repo / "translate_generator/1/model.onnx").is_symlink()
    assert (repo / "translate/1/encoder.onnx").is_symlink()


def test_translation_variant_refuses_a_definition_it_cannot_rewrite():
    text = (REPOSITORY / "translate/1/translate.toml").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="no \\[endpoint\\]"):
        variant_repository.variant_definition(text.replace("[endpoint]\n", "[endpoints]\n"))
    with pytest.raises(ValueError, match="front"):
        variant_repository.variant_definition(text.replace('front = "serving.frontends.engine_front', 'x = "'))


def test_translation_variant_fits_the_beamsearch_op_front():
    text = (REPOSITORY / "translate/1/translate.toml").read_text(encoding="utf-8")
    definition = tomllib.loads(variant_repository.variant_definition(text))
    front = importlib.import_module(variant_repository.GENERATION_FRONT.split(":")[0])
    options_type = getattr(front, variant_repository.GENERATION_FRONT.split(":")[1]).Options
    check_options(options_type, list(definition["options"]), "translate (BeamSearch-op variant)")  # as at load


def _translation_section():
    def offline(runtime, beams, threads, rate):
        return {
            "runtime": runtime,
            "beams": beams,
            "threads": threads,
            "sentences": 32,
            "tokens": 320,
            "sentences_per_s": summarize([rate]),
            "tokens_per_s": summarize([rate * 10]),
        }

    def cell(throughput, p99):
        return {
            "throughput": summarize([throughput]),
            "p50_ms": summarize([p99 / 2]),
            "p99_ms": summarize([p99]),
            "requests": summarize([throughput]),
            "errors": summarize([0.0]),
            "answer_words_p50": summarize([7.0]),
            "slowest_answer_words_p50": summarize([p99 / 10]),
        }

    def point(clients, beams, engine, today):
        return {"clients": clients, "beams": beams, "servers": {"engine": engine, "generation_front": today}}

    def stream(beams, ttft, full):
        times = {"ttft_p50_ms": ttft, "p50_ms": full, "ttft_p99_ms": 3 * ttft, "p99_ms": 3 * full}
        step = max(1, beams - 1)
        certain = {"first_text_step_p50": step, "steps_p50": 10, "first_text_share_p50": step / 10}
        timed = {key: summarize([value]) for key, value in times.items()}
        return {"clients": 16, "beams": beams, **timed, "certain_text": certain}

    rates = {1: {1: 100.0, 2: 120.0}, 4: {1: 40.0, 2: 30.0}}  # CTranslate2 fp32: best at 2 threads, then 1
    section = {
        "sentences": 32,
        "texts_source": "test",
        "batch": 32,
        "max_new_tokens": 48,
        "clients": [16, 32],
        "window_s": 1.0,
        "warmup_s": 0.5,
        "cpu": {"flags": ["avx2"], "onnxruntime": "1"},
        "offline": [
            offline(runtime, beams, threads, rates[beams][threads] if runtime == translation_offline.CT2_FP32 else 50.0)
            for beams in translation.BEAMS
            for threads in (1, 2)
            for runtime in translation_offline.RUNTIMES
        ],
        "served": [
            point(16, 1, cell(130.0, 100.0), cell(60.0, 150.0)),
            point(32, 1, cell(150.0, 200.0), cell(50.0, 400.0)),
            point(16, 4, cell(30.0, 300.0), cell(20.0, 250.0)),
            point(32, 4, cell(36.0, 500.0), cell(24.0, 600.0)),
        ],
        "streaming": [stream(1, 10.0, 100.0), stream(4, 90.0, 100.0)],
    }
    section["ratios"] = translation.ratios(section)
    section["bars"] = translation.bars(section)
    return section


def test_translation_ratios_take_the_best_baseline_and_the_right_points():
    greedy, beam4 = _translation_section()["ratios"]
    assert greedy["ctranslate2_fp32_threads"] == 2 and beam4["ctranslate2_fp32_threads"] == 1
    assert greedy["served_vs_ctranslate2"] == pytest.approx(150 / 120)  # served at the most clients
    assert beam4["served_vs_ctranslate2"] == pytest.approx(36 / 40)
    assert greedy["served_vs_today"] == pytest.approx(3.0) and beam4["served_vs_today"] == pytest.approx(1.5)
    assert greedy["p99_clients"] == 16 and greedy["p99_engine_vs_today"] == pytest.approx(100 / 150)
    assert beam4["p99_engine_vs_today"] == pytest.approx(300 / 250)
    assert greedy["ttft_vs_full"] == pytest.approx(0.1) and beam4["ttft_vs_full"] == pytest.approx(0.9)


def test_translation_bars_say_met_or_missed_with_the_numbers():
    section = _translation_section()
    met = {c["name"]: c["met"] for c in section["bars"]}
    assert met == {
        "translate served ≥ 1.0× CTranslate2 offline (greedy)": True,
        "translate served ≥ 2× today's served translate (greedy)": True,
        "translate p99 at 16 clients not worse, engine ÷ today (greedy)": True,
        "streaming TTFT ≤ 20% of full latency at 16 clients (greedy)": True,
        "translate served ≥ 1.0× CTranslate2 offline (beam 4)": False,
        "translate served ≥ 2× today's served translate (beam 4)": False,
        "translate p99 at 16 clients not worse, engine ÷ today (beam 4)": False,
        "streaming TTFT ≤ 20% of full latency at 16 clients (beam 4)": False,
    }
    markdown = "\n".join(translation_report.markdown(section))
    assert "- served ≥ 1.0× CTranslate2 offline (greedy): met, 1.25×" in markdown
    assert "- ≥ 2× today's served translate (beam 4): **missed**, 1.50×" in markdown
    assert "- p99 at 16 clients not worse (beam 4): **missed**, engine 300 ms vs today 250 ms" in markdown
    # what the engine's tail was made of, at the bar's client count
    assert "requests at or above its p99 had answers of 30 words (median), against 7 over all" in markdown
    # and the floor exact streaming puts under the first piece
    floor = "the first text is certain after 3 of 10 steps (median; median share 30.0%), a floor under this ratio"
    assert f"= 90.0%; decoded offline, {floor}" in markdown
    assert "| 16 | beam 4 | 90 | 100 | 90.0% | 270 / 300 | step 3 of 10 (30.0%) |" in markdown
    assert "- streaming TTFT ≤ 20% of full latency at 16 clients (greedy): met" in markdown


def test_cores_during_reads_the_cpu_used_up_to_the_end_of_the_load(monkeypatch):
    """A load shorter than the sampling interval is still counted: the end reading is taken after the load."""
    me = os.getpid()
    monkeypatch.setattr(cpu_share, "process_kind", lambda pid: "this test" if pid == me else None)

    def spin() -> None:
        until = time.process_time() + 0.3
        while time.process_time() < until:
            pass

    _, cores = cpu_share.cores_during(spin, interval_s=60.0)
    assert cores["this test"] > 0.5


def test_stream_rates_count_growth_after_the_first_minute_and_compare_the_last_minute_with_the_first():
    # (seconds, streams so far, tritonserver MB): 100 streams/s for two minutes, then 50/s; +1 MB after minute 1
    samples = [(10.0 * i, 1000 * i, 50.0) for i in range(1, 13)]
    samples += [(10.0 * i, 12000 + 500 * (i - 12), 50.0 + (i - 12) / 6) for i in range(13, 19)]
    result = streams.rates(samples)
    assert result["streams"] == 15000
    assert result["first_minute_per_s"] == 100.0 and result["last_minute_per_s"] == 50.0
    assert result["rate_ratio"] == 0.5
    assert result["bytes_per_stream"] == round(1024 * 1024 / (15000 - 6000))


def test_queue_policy_variants_change_only_the_policy_and_the_instance_count(tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    expected = {  # variant: (max_queue_size, default_timeout_microseconds, max_queue_delay_microseconds)
        "committed": (256, 1_000_000, 0),
        "none": (0, 0, 0),
        "size_only": (256, 0, 0),
        "timeout_only": (0, 1_000_000, 0),
        "committed_delay_1ms": (256, 1_000_000, 1000),
        "committed_returned": (256, 1_000_000, 0),
    }
    assert set(expected) == set(queue_policy.VARIANTS)
    for variant, (size, timeout, delay) in expected.items():
        repo = queue_policy.repository(tmp_path, variant, 1)
        text = (repo / "sentiment" / "config.pbtxt").read_text()
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        batching = config.dynamic_batching
        assert batching.default_queue_policy.max_queue_size == size, variant
        assert batching.default_queue_policy.default_timeout_microseconds == timeout, variant
        assert batching.max_queue_delay_microseconds == delay, variant
        assert [group.count for group in config.instance_group] == [1], variant
        sends = config.parameters[SEND_AFTER_EXECUTE].string_value if SEND_AFTER_EXECUTE in config.parameters else None
        assert sends == ("false" if variant == "committed_returned" else None), variant
        assert (repo / "sentiment_encoder" / "config.pbtxt").exists()


def test_the_summary_table_is_what_the_result_files_give():
    from benchmarks import summary
    from benchmarks.markdown import between_markers

    assert summary.main(["--check"]) == 0, "run `python -m benchmarks.summary`"
    run = {"protocol": "grpc", "abandoned_share": 0.0, "cancelled": False, "bytes_per_stream": 900, "rate_ratio": 0.9}
    growth, rate = summary.stream_bars({"runs": [run]})
    assert not growth["met"] and rate["met"]  # a bar that fails shows as failed
    rows = [
        {"variant": variant, "instances": count, "concurrency": c, "p99_ms": p99}
        for variant, count, c, p99 in [
            ("committed", 1, 32, 500.0), ("none", 1, 32, 40.0), ("committed", 2, 32, 45.0), ("none", 2, 32, 40.0),
            ("committed", 2, 8, 900.0), ("size_only", 2, 32, 1.0),
        ]
    ]  # fmt: skip
    one, two = summary.queue_policy_bars({"rows": rows})
    assert (one["value"], one["met"]) == (12.5, False) and (two["value"], two["met"]) == (1.125, True)
    assert "1 instance" in one["name"] and "2 instance" in two["name"]
    with pytest.raises(ValueError, match="markers"):
        between_markers("# no markers", summary.BEGIN, summary.END, "| table |")


def test_the_compose_table_is_what_the_committed_compose_run_gives():
    from benchmarks import compose_table

    assert compose_table.main(["--check"]) == 0, "run `python -m benchmarks.compose_table`"
    result = json.loads(compose_table.RESULT.read_text(encoding="utf-8"))
    result["image_bytes"] = {"ropeserve-triton:cpu": 1_240_579_597}
    result["memory"] = {"ropeservetest_triton_1": "1.429GiB / 23.54GiB"}
    lines = "\n".join(compose_table.table(result))
    assert "`ropeserve-triton:cpu` 1,241 MB" in lines and "Triton 1.429GiB" in lines
    assert "Prometheus not measured" in lines
    with pytest.raises(ValueError, match="lacks commit"):
        compose_table.table({key: value for key, value in result.items() if key != "commit"})


def test_the_swarm_table_is_what_the_committed_swarm_run_gives():
    from benchmarks import swarm_table

    assert swarm_table.main(["--check"]) == 0, "run `python -m benchmarks.swarm_table`"
    result = json.loads(swarm_table.RESULT.read_text(encoding="utf-8"))
    killed = next(phase for phase in result["phases"] if phase["name"] == "a replica killed")
    killed.update(failed=3, errors=["ClientError: x"], whole_s=12.5)
    lines = "\n".join(swarm_table.table(result))
    assert "| a replica killed | 2 |" in lines and "| 3 | 12.5 s |" in lines and "`ClientError: x`" in lines
    with pytest.raises(ValueError, match="lacks phases"):
        swarm_table.table({key: value for key, value in result.items() if key != "phases"})


def test_graph_memory_reports_each_processes_share_of_the_built_in_translator():
    """benchmarks.graph_memory on the built-in translator's step graphs: two processes, each with its resident,
    proportional and anonymous memory, and without prepacking the weights it packs no copy of (less anonymous)."""
    from benchmarks.graph_memory import measure

    folder = REPOSITORY / "translate" / "1"
    packed, mapped = (measure(folder, 2, "fp32", prepack) for prepack in (True, False))
    assert packed["processes"] == 2 and len(packed["rss_mb"]) == 2 and all(d > 0 for d in packed["decode_s"])
    assert 0 < packed["pss_mb_total"] <= sum(packed["rss_mb"])
    assert sum(mapped["anonymous_mb"]) < sum(packed["anonymous_mb"])
