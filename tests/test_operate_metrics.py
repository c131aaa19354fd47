"""The front models' custom metrics: what FrontModel reports (fake pb_utils), and what the real server exports."""

from __future__ import annotations

import json
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_text import metric_values, scrape, settled
from tritonclient.utils import InferenceServerException

from serving.frontends import metrics as fm
from serving.frontends.base import FrontModel, InputError

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"

# ---- a stand-in for triton_python_backend_utils: just enough for FrontModel and FrontMetrics ----------------


class FakeMetric:
    def __init__(self, family: FakeFamily, labels: dict, buckets: list | None) -> None:
        self.family, self.labels, self.buckets = family, labels, buckets
        self.values: list[float] = []

    def increment(self, value: float) -> None:
        assert self.family.kind == FakeFamily.COUNTER
        self.values.append(value)

    def observe(self, value: float) -> None:
        assert self.family.kind == FakeFamily.HISTOGRAM
        self.values.append(value)

    def set(self, value: float) -> None:
        assert self.family.kind == FakeFamily.GAUGE
        self.values = [value]


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    created: dict[str, FakeFamily] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[FakeMetric] = []
        FakeFamily.created[name] = self

    def Metric(self, labels: dict, buckets: list | None = None) -> FakeMetric:  # noqa: N802 - pb_utils' name
        if (self.kind == self.HISTOGRAM) != (buckets is not None):
            raise ValueError("buckets are required for histograms and refused otherwise (as Triton does)")
        metric = FakeMetric(self, labels, buckets)
        self.metrics.append(metric)
        return metric

    def total(self, **labels: str) -> float:
        return sum(sum(m.values) for m in self.metrics if all(m.labels.get(k) == v for k, v in labels.items()))


class FakeTensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class FakeError:
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message: str, code: str) -> None:
        self.message, self.code = message, code


class FakeResponse:
    def __init__(self, output_tensors=None, error=None) -> None:
        self.output_tensors, self.error = output_tensors, error


class FakePb:
    MetricFamily = FakeFamily
    Tensor = FakeTensor
    TritonError = FakeError
    InferenceResponse = FakeResponse

    @staticmethod
    def get_input_tensor_by_name(request: dict, name: str) -> FakeTensor | None:
        return FakeTensor(name, request[name]) if name in request else None

    @staticmethod
    def triton_string_to_numpy(name: str):
        return {"TYPE_STRING": np.object_, "BYTES": np.object_, "TYPE_FP32": np.float32}[name]


ECHO_DEFINITION = """
summary = "count characters"
example = "python -m clients echo hello"
[endpoint]
front = "test_operate_metrics:EchoFront"
max_batch_size = 8
queue = { max_size = 8, timeout_s = 1 }
outputs = [{ name = "LENGTH", type = "fp32" }]
[loadtest]
texts = ["hello"]
"""


class EchoFront(FrontModel):
    """A front model whose task is 'count the characters'; 'boom' raises a server fault."""

    def run_group(self, texts: list[str], options: object) -> list[tuple]:
        if "boom" in texts:
            raise RuntimeError("boom")
        self.metrics.encoded([len(t) for t in texts], [len(t) > 5 for t in texts])
        return [(float(len(t)),) for t in texts]


@pytest.fixture
def front(tmp_path) -> EchoFront:
    FakeFamily.created.clear()
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "echo.toml").write_text(ECHO_DEFINITION)
    config = {"name": "echo", "output": [{"name": "LENGTH", "data_type": "TYPE_FP32"}]}
    args = {
        "model_config": json.dumps(config),
        "model_repository": str(tmp_path),
        "model_version": "1",
        "model_instance_name": "echo_0_0",
    }
    return EchoFront(FakePb, args)


def text_request(*texts: bytes) -> dict:
    return {"TEXT": np.array([[t] for t in texts], dtype=np.object_)}


def test_every_family_is_created_once_with_its_kind(front):
    assert set(FakeFamily.created) == {spec.name for spec in fm.ALL_METRICS}
    assert all(FakeFamily.created[s.name].kind == s.kind for s in fm.ALL_METRICS)
    # every series exists (at 0) before the first request, one per rejection reason
    rejected = FakeFamily.created[fm.REJECTED.name].metrics
    assert sorted(m.labels["reason"] for m in rejected) == sorted(fm.REJECT_REASONS)
    assert all(m.labels["model"] == "echo" and m.labels["model_instance"] == "echo_0_0" for m in rejected)
    assert FakeFamily.created[fm.BATCH_SIZE.name].metrics[0].buckets == list(fm.BATCH_BUCKETS)


def test_execute_counts_requests_batch_tokens_truncations_and_rejections_by_reason(front):
    requests = [
        text_request(b"abc", b"abcdefgh"),  # 2 texts, one longer than 5 "tokens"
        text_request(b""),  # empty_text
        text_request(b"\xff\xfe"),  # invalid_utf8
        {"OTHER": np.zeros((1, 1))},  # missing_input
        text_request(b"xyz"),
    ]
    responses = front.execute(requests)
    assert [r.error is None for r in responses] == [True, False, False, False, True]
    created = FakeFamily.created
    front.metrics.flush()
    assert created[fm.REQUESTS.name].total(model="echo") == 5
    assert created[fm.TEXTS.name].total() == 3
    assert created[fm.INPUT_TOKENS.name].total() == 3 + 8 + 3
    assert created[fm.TRUNCATED.name].total() == 1
    assert created[fm.BATCH_SIZE.name].total() == 3  # one execute() call observed: 3 valid texts together
    assert len([v for m in created[fm.BATCH_SIZE.name].metrics for v in m.values]) == 1
    rejected = {m.labels["reason"]: sum(m.values) for m in created[fm.REJECTED.name].metrics}
    assert rejected["empty_text"] == 1 and rejected["invalid_utf8"] == 1 and rejected["missing_input"] == 1
    assert sum(rejected.values()) == 3


def test_a_server_fault_is_counted_as_internal_error(front):
    responses = front.execute([text_request(b"boom"), text_request(b"fine")])
    assert all(r.error is not None and r.error.code == FakeError.INTERNAL for r in responses)  # same group
    front.metrics.flush()
    rejected = {m.labels["reason"]: sum(m.values) for m in FakeFamily.created[fm.REJECTED.name].metrics}
    assert rejected["internal_error"] == 2


def test_unknown_reason_is_folded_into_invalid_input_and_no_metric_api_means_no_op():
    assert InputError("x").reason == "invalid_input"
    FakeFamily.created.clear()
    metrics = fm.FrontMetrics(FakePb, "m", "m_0")
    metrics.rejected("some new reason")
    metrics.flush()
    assert {m.labels["reason"]: sum(m.values) for m in FakeFamily.created[fm.REJECTED.name].metrics}[
        "invalid_input"
    ] == 1
    silent = fm.FrontMetrics(object(), "m", "m_0")  # a pb without MetricFamily
    silent.requests(3)
    silent.batch(2)
    silent.generated(5)
    assert not silent.enabled


# ---- the real server ---------------------------------------------------------------------------------------


LONG_TEXT = "这家店的菜味道很好，服务也不错，下次还会再来。" * 40  # far past any endpoint's maximum


def totals(metrics_url: str) -> dict[tuple[str, str, str], float]:
    """(metric, model, reason) → value summed over instances, for every ropeserve_* series."""
    out: dict[tuple[str, str, str], float] = defaultdict(float)
    for line in scrape(metrics_url).splitlines():
        if not line.startswith(fm.PREFIX):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        labels = dict(part.split("=", 1) for part in head[len(name) + 1 : -1].split(",")) if "{" in head else {}
        if labels.get("le"):
            continue
        key = (name, labels.get("model", "").strip('"'), labels.get("reason", "").strip('"'))
        out[key] += float(value)
    return out


def infer(client: grpcclient.InferenceServerClient, model: str, texts: list[bytes], **ints: int):
    inputs = [grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[t] for t in texts], dtype=np.object_))
    for name, value in ints.items():
        tensor = grpcclient.InferInput(name, [len(texts), 1], "INT32")
        tensor.set_data_from_numpy(np.full((len(texts), 1), value, dtype=np.int32))
        inputs.append(tensor)
    return client.infer(model, inputs)


def test_real_server_exports_the_custom_metrics(triton):
    max_tokens = json.loads((REPOSITORY / "sentiment" / "1" / "config.json").read_text())["max_tokens"]
    read = partial(totals, triton.metrics_url)
    before = settled(read, lambda now: True)  # with the earlier tests' last updates
    names = {name for name, _, _ in before}
    for spec in fm.ALL_METRICS:
        assert set(fm.exported_names(spec)) <= names | {spec.name + "_bucket"}, spec.name
    assert metric_values(scrape(triton.metrics_url), "ropeserve_batch_size_bucket", model="sentiment", le="+Inf")

    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        infer(client, "sentiment", [LONG_TEXT.encode(), "这部电影不差".encode()])
        texts = [t.encode() for t in ("我爱你。", "他休息两天。", "今天天气很好。")]
        result = infer(client, "translate", texts, MAX_NEW_TOKENS=4, NUM_BEAMS=1)
        assert result.as_numpy("TRANSLATION").shape == (3, 1)
        with pytest.raises(InferenceServerException, match="is empty"):
            infer(client, "sentiment", [b"   "])
        with pytest.raises(InferenceServerException, match="NUM_BEAMS must be between 1 and 8, got 9"):
            infer(client, "summarize", ["今天天气很好。".encode()], NUM_BEAMS=9)

    def delta(name: str, model: str, reason: str = "") -> float:
        return after[(name, model, reason)] - before.get((name, model, reason), 0.0)

    generated = ("ropeserve_generated_tokens_total", "translate", "")
    after = settled(read, lambda now: now[generated] > before.get(generated, 0.0))

    assert delta("ropeserve_requests_total", "sentiment") == 2
    assert delta("ropeserve_texts_total", "sentiment") == 2
    assert delta("ropeserve_truncated_texts_total", "sentiment") == 0  # read whole, in windows
    assert delta("ropeserve_windows_per_text_count", "sentiment") == 2
    assert delta("ropeserve_windows_per_text_sum", "sentiment") >= 1 + 3  # the long text: 440 tokens, 128 a window
    assert delta("ropeserve_input_tokens_total", "sentiment") >= max_tokens + 1
    assert delta("ropeserve_batch_size_count", "sentiment") == 1
    assert delta("ropeserve_batch_size_sum", "sentiment") == 2
    assert delta("ropeserve_rejected_requests_total", "sentiment", "empty_text") == 1
    assert delta("ropeserve_rejected_requests_total", "summarize", "option_out_of_range") == 1
    assert delta("ropeserve_texts_total", "translate") == 3
    assert delta("ropeserve_sentences_per_text_sum", "translate") == 3
    assert delta("ropeserve_truncated_texts_total", "translate") == 0
    assert 1 <= delta("ropeserve_generated_tokens_total", "translate") <= 3 * 4  # at most MAX_NEW_TOKENS per text
    assert delta("ropeserve_generated_tokens_total", "sentiment") == 0


def test_a_failing_metrics_api_never_fails_the_model(front, capsys):
    class Broken:
        COUNTER, HISTOGRAM = "counter", "histogram"

        def __init__(self, **kwargs) -> None:
            raise RuntimeError("metrics are disabled")

    class BrokenPb(FakePb):
        MetricFamily = Broken

    metrics = fm.FrontMetrics(BrokenPb, "m", "m_0")
    assert not metrics.enabled and "custom metrics of m_0 disabled" in capsys.readouterr().err
    front.metrics = metrics
    assert front.execute([text_request(b"abc")])[0].error is None
    # a series that breaks later (an increment that raises) disables metrics the same way
    flaky = fm.FrontMetrics(FakePb, "m", "m_1", flush_period_s=3600)
    for series in flaky._series.values():
        series.increment = series.observe = lambda value: (_ for _ in ()).throw(RuntimeError("gone"))
    flaky.requests(1)
    flaky.batch(2)
    assert flaky.enabled  # nothing is sent before the flush
    flaky.flush()
    assert not flaky.enabled


def test_metric_values_reads_exposition_text_as_prometheus_does():
    """Triton names its counters without `_total`, the front models with it; labels must match as a subset."""
    text = (
        "# HELP nv_inference_count rows\n# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="sentiment",version="1"} 16\nnv_inference_count{model="translate",version="1"} 4\n'
        "# HELP ropeserve_texts_total texts\n# TYPE ropeserve_texts_total counter\n"
        'ropeserve_texts_total{model="sentiment",model_instance="sentiment_0_0"} 3\n'
        "# HELP nv_inference_request_summary_us latency\n# TYPE nv_inference_request_summary_us summary\n"
        'nv_inference_request_summary_us{model="sentiment",version="1",quantile="0.5"} 10\n'
        'nv_inference_request_summary_us_count{model="sentiment",version="1"} 2\n'
        'nv_inference_count_other{model="sentiment"} 99\n'
    )
    assert metric_values(text, "nv_inference_count") == [16, 4]
    assert metric_values(text, "nv_inference_count", model="sentiment") == [16]
    assert metric_values(text, "ropeserve_texts_total", model="sentiment") == [3]
    assert metric_values(text, "nv_inference_request_summary_us", quantile="0.5") == [10]
    assert metric_values(text, "nv_inference_request_summary_us_count") == [2]
    assert metric_values(text, "nv_inference_count", model="summarize") == []
