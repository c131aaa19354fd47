"""The launcher's drain on its own: the front model goes first while the models it calls stay up, so the requests it
holds finish (their BLS calls still succeed) and new ones are refused by name."""

from __future__ import annotations

import threading
import time

import tritonclient.grpc as grpcclient
from reliability_helpers import connect, outcome, text_input

from serving.launcher.control import repository_index
from serving.launcher.drain import drain_front_models

SUMMARIZE = ["summarize", "summarize_generator", "summarize_extractor"]
NEWS = "国家统计局今天发布数据，上半年国内生产总值同比增长百分之七，增速与一季度持平，消费对经济增长的贡献率继续提高。"


def abstractive(texts: list[str]) -> list:
    mode = text_input(grpcclient, ["abstractive"] * len(texts), name="MODE")
    return [text_input(grpcclient, texts), mode]


def test_drain_unloads_the_front_first_and_lets_its_requests_finish(start_server):
    server = start_server(SUMMARIZE)
    results: list[str] = []

    def slow_request() -> None:  # 16 abstractive summaries: the front holds it while its generator runs
        with connect(server, "grpc") as client:
            results.append(outcome(client, "summarize", abstractive([NEWS] * 16), timeout_s=60))

    threads = [threading.Thread(target=slow_request) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    drained = drain_front_models(server.http_url, server.control_headers("http"), timeout_s=60)
    took = time.monotonic() - started
    for thread in threads:
        thread.join(timeout=60)

    assert drained == ["summarize"]  # the Python-backend front, not the ONNX models it calls
    assert results == ["ok"] * 4, results  # held requests finished after the unload began
    index = repository_index(server.http_url, server.control_headers())
    states = {entry["name"]: entry.get("state") for entry in index}
    assert states["summarize"] == "UNAVAILABLE" and states["summarize_generator"] == "READY", states
    assert took < 60, "the drain returned at its timeout, not when the front was gone"
    with connect(server, "grpc") as client:
        refused = outcome(client, "summarize", [text_input(grpcclient, [NEWS])], timeout_s=10)
    assert "NOT_FOUND" in refused and "summarize" in refused, refused
