"""Locust users for the endpoints of ``tasks/*.toml``: ``GrpcTritonUser`` (tritonclient.grpc) and ``HttpTritonUser``
(KServe v2 JSON).

Each user picks an endpoint per request by the ``--mix`` weights and a text from the test sets
(``--data-dir``) or the built-in list. Run it through ``make loadtest`` / ``python -m loadtest.run``, which
sets the options and writes the report; by hand::

    locust -f loadtest/locustfile.py --headless -u 4 -t 30s --host http://127.0.0.1:8000 \
        --grpc-host 127.0.0.1:8001 GrpcTritonUser HttpTritonUser

A request counts as failed when the server answers with an error or an answer without the expected output
row (what the text says is not checked: that is the models' business, not the load test's).
"""

from __future__ import annotations

import random
import time
from typing import Any

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any gRPC channel exists: gRPC must cooperate with locust's gevent loop

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from locust import HttpUser, User, constant, events, task  # noqa: E402

from loadtest.texts import add_option_flags, default_mix, inputs_for, load_texts, parse_mix  # noqa: E402
from loadtest.texts import options as task_options  # noqa: E402
from tasks.definition import registry  # noqa: E402

SETTINGS: dict[str, Any] = {}


def output_of(endpoint: str) -> str:
    """The output whose row a successful answer must hold (the task's first)."""
    return registry()[endpoint].endpoint.outputs[0].name


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("ropeserve")
    group.add_argument("--grpc-host", default="127.0.0.1:8001", help="Triton gRPC address host:port")
    group.add_argument("--mix", default=default_mix(), help="endpoint weights")
    group.add_argument("--data-dir", default="", help="data directory with the test sets (else built-in texts)")
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
        texts=texts,
        endpoints=[e for e, w in weights.items() if w > 0],
        weights=[w for w in weights.values() if w > 0],
        grpc_host=options.grpc_host,
        option_values={keyword: getattr(options, keyword) for keyword in task_options()},
        timeout=options.request_timeout,
    )
    for endpoint, source in sources.items():
        print(f"loadtest: {endpoint} texts from {source} ({len(texts[endpoint])})", flush=True)


def _pick() -> tuple[str, str]:
    endpoint = random.choices(SETTINGS["endpoints"], SETTINGS["weights"])[0]
    return endpoint, random.choice(SETTINGS["texts"][endpoint])


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
        endpoint, text = _pick()
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
            name=endpoint,
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
        endpoint, text = _pick()
        inputs = [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]
        inputs += [
            {"name": name, "shape": [1, 1], "datatype": _datatype(value), "data": [value]}
            for name, value in _options(endpoint).items()
        ]
        with self.client.post(
            f"/v2/models/{endpoint}/infer",
            json={"inputs": inputs},
            name=endpoint,
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
