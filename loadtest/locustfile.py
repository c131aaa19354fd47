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

A streaming twin in the mix (``translate_stream``, ``summarize_stream``: loadtest/texts.py) is called as users call
it: over gRPC one bidirectional ``ModelStreamInfer`` stream per answer (the request the SDK sends), over HTTP
with ``POST /v2/models/<twin>/generate_stream`` (server-sent events) through locust's own session. Its locust request
is the whole answer (response time: until the last event); a stream that ends without a non-empty piece fails. Each
answer's time to its first non-empty piece, its mean time between pieces and its whole time go to
``<csv prefix>_streams.json`` beside locust's CSV files (loadtest/report.py reads it), not to locust's stats: extra
``events.request`` entries would count each streamed request two or three times in the Aggregated row, its
requests/s, failure ratio and p99, which the verdict reads.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from typing import Any

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any gRPC channel exists: gRPC must cooperate with locust's gevent loop

import tritonclient.grpc as grpcclient  # noqa: E402
from locust import HttpUser, User, constant, events, task  # noqa: E402

from clients.endpoints import build_inputs, to_infer_input  # noqa: E402
from clients.endpoints import endpoint as sdk_endpoint  # noqa: E402
from clients.streaming import _inputs as stream_inputs  # noqa: E402
from clients.streaming import stream_model  # noqa: E402
from loadtest.texts import (  # noqa: E402
    DEFAULT_PARAGRAPHS,
    Picker,
    Request,
    add_option_flags,
    default_mix,
    inputs_for,
    is_stream,
    keywords_for,
    load_texts,
    paragraph_endpoints,
    parse_mix,
    parse_paragraphs,
    task_of,
)
from loadtest.texts import options as task_options  # noqa: E402
from tasks.definition import registry  # noqa: E402

SETTINGS: dict[str, Any] = {}
GATEWAY = "gateway"  # the request type of GatewayUser's requests in locust's stats
SENT: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # (type, name) -> [requests, sentences]
SENTENCES_SUFFIX = "_sentences.json"  # beside locust's CSV files: sentences per request name (loadtest/report.py)
STREAMS_SUFFIX = "_streams.json"  # beside locust's CSV files: each streamed answer's timings (loadtest/report.py)
# (type, name) -> one [end (unix s), first piece ms, mean ms between pieces (None: one piece), whole ms, pieces]
# per successful streamed answer
STREAMED: dict[tuple[str, str], list[list[float | None]]] = defaultdict(list)


def output_of(endpoint: str) -> str:
    """The output whose row a successful answer must hold (the task's first; a streaming twin's first)."""
    task = registry()[task_of(endpoint)]
    twin = task.stream if is_stream(endpoint) else task.endpoint
    assert twin is not None
    return twin.outputs[0].name


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("ropeserve")
    group.add_argument("--grpc-host", default="127.0.0.1:8001", help="Triton gRPC address host:port")
    group.add_argument("--gateway-host", default="http://127.0.0.1:5000", help="the gateway's URL (GatewayUser)")
    group.add_argument("--gateway-key", default="", help="API key for the gateway, if it asks for one")
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
        gateway_host=options.gateway_host,
        gateway_key=options.gateway_key,
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


@events.quitting.add_listener
def _write_streams(environment: Any, **_: Any) -> None:
    """Each streamed answer's timings, beside the CSV files: the report's first-piece and between-pieces columns."""
    options = environment.parsed_options
    if options is None or not options.csv_prefix or not STREAMED:
        return
    rows = [{"type": t, "name": n, "samples": samples} for (t, n), samples in sorted(STREAMED.items())]
    with open(options.csv_prefix + STREAMS_SUFFIX, "w") as f:
        json.dump({"fields": ["end", "first_ms", "gap_ms", "whole_ms", "pieces"], "rows": rows}, f)


class PieceClock:
    """Times one streamed answer from its creation: the first non-empty piece, the pieces after it, the whole."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last = 0.0
        self.end: float | None = None
        self.pieces = 0
        self.length = 0  # bytes of the answer's text

    def piece(self, text: str) -> None:
        if not text:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.pieces += 1
        self.length += len(text.encode("utf-8"))

    def finish(self) -> None:
        """The answer is complete (ValueError if it held no piece: an empty answer counts as failed)."""
        self.end = time.perf_counter()
        if self.first is None:
            raise ValueError("the stream ended without a non-empty piece")

    def whole_ms(self) -> float:
        return ((self.end or time.perf_counter()) - self.start) * 1000

    def record(self, request_type: str, name: str) -> None:
        assert self.first is not None and self.end is not None
        gap = (self.last - self.first) * 1000 / (self.pieces - 1) if self.pieces > 1 else None
        first = (self.first - self.start) * 1000
        STREAMED[(request_type, name)].append([time.time(), first, gap, self.whole_ms(), self.pieces])


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
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.client = grpcclient.InferenceServerClient(url=SETTINGS["grpc_host"])
        # The streaming twins: a stream read in this greenlet, on a channel of its own (tritonclient's streams
        # read on a thread of theirs)
        self.channel = grpc.insecure_channel(SETTINGS["grpc_host"])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def on_stop(self) -> None:
        self.client.close()  # an open channel keeps locust from exiting
        self.channel.close()

    @task
    def infer(self) -> None:
        request = _pick("grpc")
        if is_stream(request.endpoint):
            self.stream(request)
            return
        endpoint, text = request.endpoint, request.text
        options = keywords_for(endpoint, SETTINGS["option_values"])
        inputs = build_inputs(sdk_endpoint(task_of(endpoint)), [text], options, grpcclient.InferInput)
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

    def stream(self, request: Request) -> None:
        """A streaming twin over one gRPC bidirectional stream, read in this greenlet; the request's time is the
        whole answer's."""
        options = keywords_for(request.endpoint, SETTINGS["option_values"])
        clock = PieceClock()
        exception: Exception | None = None
        call = None
        try:
            model, output, known = stream_model(task_of(request.endpoint))
            arrays = stream_inputs(request.text, options, known)
            inputs = [to_infer_input(name, array, grpcclient.InferInput) for name, array in arrays.items()]
            call = self.stub.ModelStreamInfer(iter([stream_request(model, inputs)]), timeout=SETTINGS["timeout"])
            for response in call:  # to the call's end: the server ends it after the final response
                if response.error_message:
                    raise RuntimeError(response.error_message)
                piece = grpcclient.InferResult(response.infer_response).as_numpy(output)
                if piece is not None and piece.size:
                    clock.piece(piece.reshape(-1)[0].decode("utf-8"))
                if response.infer_response.parameters["triton_final_response"].bool_param:
                    clock.finish()
            if clock.end is None:
                raise ValueError("the stream ended without its final response")
        except Exception as err:  # noqa: BLE001 - every failure is reported to locust, none ends the user
            exception = err
        finally:
            if call is not None:  # read, not cancelled, to its end: Triton 2.51 mishandles cancelled streams
                with contextlib.suppress(Exception):
                    for _ in call:
                        pass
        events.request.fire(
            request_type="grpc",
            name=request.name,
            response_time=clock.whole_ms(),
            response_length=clock.length,
            exception=exception,
            context={},
        )
        if exception is None:
            clock.record("grpc", request.name)


def stream_request(model: str, inputs: list[Any]) -> Any:
    """The request tritonclient's ``async_stream_infer`` sends, with an empty final response asked for.

    The SDK's stream (clients/streaming.py) reads its responses on tritonclient's own thread through a queue; under
    locust's gevent that hand-off can miss its wake-up and leave a stream waiting out its timeout (seen: a 6 s run
    that did not exit in 66 s). Read here, the response iterator is gRPC's own, which gevent's gRPC mode serves."""
    from tritonclient.grpc._utils import _get_inference_request

    request = _get_inference_request(
        model_name=model,
        inputs=inputs,
        model_version="",
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


class HttpTritonUser(HttpUser):
    """HTTP with KServe v2 JSON (``POST /v2/models/<endpoint>/infer``) through locust's own client."""

    wait_time = constant(0)

    @task
    def infer(self) -> None:
        request = _pick("POST")
        if is_stream(request.endpoint):
            self.stream(request)
            return
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

    def stream(self, request: Request) -> None:
        """A streaming twin over ``POST /v2/models/<twin>/generate_stream``: server-sent events (``data: {...}``
        lines, one per piece) read as they come (``stream=True``); locust's response time, set here, is the whole
        answer's (locust's own would stop at the headers)."""
        endpoint, output = request.endpoint, output_of(request.endpoint)
        body = {"TEXT": request.text, **_options(endpoint)}
        clock = PieceClock()
        with self.client.post(
            f"/v2/models/{endpoint}/generate_stream",
            json=body,
            name=request.name,
            timeout=SETTINGS["timeout"],
            stream=True,
            catch_response=True,
        ) as response:
            try:
                if response.status_code != 200:
                    raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
                for line in response.iter_lines(chunk_size=None):  # each chunk as it arrives
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[len(b"data:") :])
                    if "error" in event:
                        raise ValueError(f"{endpoint}: {event['error']}")
                    if output not in event:
                        raise ValueError(f"{endpoint}: a streamed event has no {output}")
                    clock.piece(event[output])
                clock.finish()
            except Exception as err:  # noqa: BLE001 - a broken stream (ChunkedEncodingError, ...) fails the request
                response.failure(str(err)[:300] or repr(err))
            else:
                clock.record("POST", request.name)
            finally:
                response.close()
                response.request_meta["response_time"] = clock.whole_ms()
                response.request_meta["response_length"] = clock.length


class GatewayUser(HttpUser):
    """The gateway's routes (serving/gateway) as the apps that use them call them: `translate` through DeepL's
    ``POST /v2/translate`` (its other options left to the server: DeepL has no beams), the other tasks through
    ``POST /v1/<task>`` with their options, a streaming twin through ``POST /v1/<task>/stream`` (server-sent
    events, timed as the Triton streams are). Its requests are of type ``gateway`` under the endpoint's name."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.client.base_url = SETTINGS["gateway_host"]
        if SETTINGS["gateway_key"]:
            self.client.headers["Authorization"] = f"Bearer {SETTINGS['gateway_key']}"

    @task
    def infer(self) -> None:
        request = _pick(GATEWAY)
        name = task_of(request.endpoint)
        if is_stream(request.endpoint):
            self.stream(request, name)
            return
        if name == "translate":
            route, body, answers = "/v2/translate", {"text": [request.text], "target_lang": "EN-US"}, "translations"
        else:
            route, body = f"/v1/{name}", {"texts": [request.text], **keywords_for(name, SETTINGS["option_values"])}
            answers = "results"
        with self.client.post(
            route, json=body, name=request.name, timeout=SETTINGS["timeout"], catch_response=True
        ) as response:
            response.request_meta["request_type"] = GATEWAY
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            elif len((response.json() or {}).get(answers, [])) != 1:
                response.failure(f"{route}: expected 1 answer in {answers!r}, got {response.text[:200]}")

    def stream(self, request: Request, name: str) -> None:
        route = f"/v1/{name}/stream"
        body = {"text": request.text, **keywords_for(name, SETTINGS["option_values"])}
        clock = PieceClock()
        with self.client.post(
            route, json=body, name=request.name, timeout=SETTINGS["timeout"], stream=True, catch_response=True
        ) as response:
            try:
                if response.status_code != 200:
                    raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
                event_name = ""
                for line in response.iter_lines(chunk_size=None):
                    if line.startswith(b"event:"):
                        event_name = line[len(b"event:") :].strip().decode()
                    elif line.startswith(b"data:"):
                        event = json.loads(line[len(b"data:") :])
                        if event_name == "error":
                            raise ValueError(f"{route}: {event.get('error')}")
                        clock.piece(event.get("text", ""))
                        event_name = ""
                clock.finish()
            except Exception as err:  # noqa: BLE001 - a broken stream fails the request
                response.failure(str(err)[:300] or repr(err))
            else:
                clock.record(GATEWAY, request.name)
            finally:
                response.close()
                response.request_meta["request_type"] = GATEWAY
                response.request_meta["response_time"] = clock.whole_ms()
                response.request_meta["response_length"] = clock.length
