"""Locust users for the endpoints of ``tasks/*.toml``: ``GrpcTritonUser`` (tritonclient.grpc) and ``HttpTritonUser``
(KServe v2 JSON).

Each user picks an endpoint per request by the ``--mix`` weights and a text from the test sets
(``--data-dir``) or the built-in list; for the tasks whose texts are sentences, a ``--paragraphs`` share of the
requests sends 4-8 of them joined, named ``<endpoint> (paragraph)`` in locust's stats (loadtest/texts.py). Run it
through ``make loadtest`` / ``python -m loadtest.run``, which sets the options and writes the report; by hand::

    locust -f loadtest/locustfile.py --headless -u 4 -t 30s --host http://127.0.0.1:8000 \
        --grpc-host 127.0.0.1:8001 GrpcTritonUser HttpTritonUser

A request counts as failed when the server answers with an error or an answer without the expected output
row (what the text says is not checked: that is the models' business, not the load test's).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any gRPC channel exists: gRPC must cooperate with locust's gevent loop

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from locust import HttpUser, User, constant, events, task  # noqa: E402

from loadtest.texts import (  # noqa: E402
    DEFAULT_PARAGRAPHS,
    Picker,
    Request,
    add_option_flags,
    default_mix,
    inputs_for,
    load_texts,
    paragraph_endpoints,
    parse_mix,
    parse_paragraphs,
)
from loadtest.texts import options as task_options  # noqa: E402
from tasks.definition import registry  # noqa: E402

SETTINGS: dict[str, Any] = {}
SENT: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # (type, name) -> [requests, sentences]
SENTENCES_SUFFIX = "_sentences.json"  # beside locust's CSV files: sentences per request name (loadtest/report.py)


def output_of(endpoint: str) -> str:
    """The output whose row a successful answer must hold (the task's first)."""
    return registry()[endpoint].endpoint.outputs[0].name


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("ropeserve")
    group.add_argument("--grpc-host", default="127.0.0.1:8001", help="Triton gRPC address host:port")
    group.add_argument("--mix", default=default_mix(), help="endpoint weights")
    group.add_argument("--data-dir", default="", help="data directory with the test sets (else built-in texts)")
    group.add_argument(
        "--paragraphs",
        type=parse_paragraphs,
        default=DEFAULT_PARAGRAPHS,
        help=f"share of {', '.join(paragraph_endpoints())} requests that send 4-8 sentences joined (0: none)",
    )
    add_option_flags(group)
    group.add_argument("--request-timeout", type=float, default=60.0, help="seconds per request")


@events.init.add_listener
def _configure(environment: Any, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:  # locust used as a library without command-line options
        return
    texts, sources = load_texts(options.data_dir or None)
    weights = parse_mix(options.mix)
    SETTINGS.update(
        picker=Picker(texts, weights, options.paragraphs),
        grpc_host=options.grpc_host,
        option_values={keyword: getattr(options, keyword) for keyword in task_options()},
        timeout=options.request_timeout,
    )
    for endpoint, source in sources.items():
        print(f"loadtest: {endpoint} texts from {source} ({len(texts[endpoint])})", flush=True)


@events.quitting.add_listener
def _write_sentences(environment: Any, **_: Any) -> None:
    """Sentences per request name, beside the CSV files: the report shows how long the paragraphs were."""
    options = environment.parsed_options
    if options is None or not options.csv_prefix or not SENT:
        return
    rows = [{"type": t, "name": n, "requests": r, "sentences": s} for (t, n), (r, s) in sorted(SENT.items())]
    with open(options.csv_prefix + SENTENCES_SUFFIX, "w") as f:
        json.dump(rows, f, indent=1)


def _pick(request_type: str) -> Request:
    request = SETTINGS["picker"].pick()
    tally = SENT[(request_type, request.name)]
    tally[0] += 1
    tally[1] += request.sentences
    return request


def _options(endpoint: str) -> dict[str, int | str]:
    return inputs_for(endpoint, SETTINGS["option_values"])


def _datatype(value: int | str) -> str:
    """A string option's value goes as BYTES, an int option's as INT32 (inputs_for keeps the flags' types)."""
    return "BYTES" if isinstance(value, str) else "INT32"


class GrpcTritonUser(User):
    """gRPC through ``tritonclient.grpc``; each request is reported to locust with ``events.request.fire``."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.client = grpcclient.InferenceServerClient(url=SETTINGS["grpc_host"])

    def on_stop(self) -> None:
        self.client.close()  # an open channel keeps locust from exiting

    @task
    def infer(self) -> None:
        request = _pick("grpc")
        endpoint, text = request.endpoint, request.text
        inputs = [grpcclient.InferInput("TEXT", [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=np.object_))
        for name, value in _options(endpoint).items():
            tensor = grpcclient.InferInput(name, [1, 1], _datatype(value))
            if isinstance(value, str):
                tensor.set_data_from_numpy(np.array([[value.encode("utf-8")]], dtype=np.object_))
            else:
                tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            inputs.append(tensor)
        start = time.perf_counter()
        exception: Exception | None = None
        length = 0
        try:
            result = self.client.infer(endpoint, inputs, client_timeout=SETTINGS["timeout"])
            column = result.as_numpy(output_of(endpoint))
            if column is None or column.shape != (1, 1):
                raise ValueError(f"{endpoint}: expected output {output_of(endpoint)} with shape [1, 1]")
            answer = column[0, 0]  # a text answer counts its bytes; a number (an FP32 output) its array's
            length = len(answer) if isinstance(answer, bytes) else column.nbytes
        except Exception as err:  # noqa: BLE001 - every failure is reported to locust, none ends the user
            exception = err
        events.request.fire(
            request_type="grpc",
            name=request.name,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=length,
            exception=exception,
            context={},
        )


class HttpTritonUser(HttpUser):
    """HTTP with KServe v2 JSON (``POST /v2/models/<endpoint>/infer``) through locust's own client."""

    wait_time = constant(0)

    @task
    def infer(self) -> None:
        request = _pick("POST")
        endpoint, text = request.endpoint, request.text
        inputs = [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]
        inputs += [
            {"name": name, "shape": [1, 1], "datatype": _datatype(value), "data": [value]}
            for name, value in _options(endpoint).items()
        ]
        with self.client.post(
            f"/v2/models/{endpoint}/infer",
            json={"inputs": inputs},
            name=request.name,
            timeout=SETTINGS["timeout"],
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            try:
                outputs = {out["name"]: out for out in response.json()["outputs"]}
                rows = outputs[output_of(endpoint)]["data"]
            except (ValueError, KeyError, TypeError) as err:
                response.failure(f"{endpoint}: malformed answer ({err!r})")
                return
            if len(rows) != 1:
                response.failure(f"{endpoint}: expected 1 row of {output_of(endpoint)}, got {len(rows)}")
