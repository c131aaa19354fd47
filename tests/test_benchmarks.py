"""The benchmark harness: a tiny run writes sane JSON, Markdown and PNGs; a run without data says what it lacks."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import checks, data, generation, report, run, runtime, serving, threads
from benchmarks.onnx_variants import rope_path_nodes
from benchmarks.profiles import REPOSITORY, SECTIONS, profile
from benchmarks.stats import summarize
from benchmarks.variant_repository import ServingVariant, rewrite_config
from export import seq2seq
from export.data import read_sentiment
from loadtest.texts import load_texts
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
    assert set(results) >= {"meta", "ceiling", "runtime", "generation", "serving", "checks"}
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
    assert results["ceiling"]["matmul_gflops"]["median"] > 0
    assert all(0 < f["fraction_of_ceiling"] for f in results["ceiling"]["fractions"])
    assert {c["name"].split(":")[0] for c in results["checks"]}  # the bars were evaluated
    assert all(isinstance(c["met"], bool) for c in results["checks"])

    markdown = (tmp_path / "smoke.md").read_text(encoding="utf-8")
    for heading in ("## 1. Model runtime", "## 2. Generation", "## 3–4. Serving", "## 5. Ceiling", "## Bars"):
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
    readers = {"sentiment": read_sentiment, **{task: spec.reader for task, spec in seq2seq.TASKS.items()}}
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
