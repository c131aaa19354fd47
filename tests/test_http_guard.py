"""serving.launcher.http_guard without Triton: its parsing rules, and the guard in front of a tiny HTTP upstream.

tests/reliability/test_request_size.py sends the same kinds of request to the real server.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import raw_http

from serving.launcher.embedded import free_ports
from serving.launcher.http_guard import DEFAULT_MAX_BODY_BYTES, HeadError, HttpGuard, parse_request

FORM = "application/x-www-form-urlencoded"


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def post(*headers: str) -> bytes:
    return head("POST /v2/models/sentiment/infer HTTP/1.1", "Host: x", *headers)


def test_the_forwarded_head_is_the_guard_s_own() -> None:
    request = parse_request(
        head(
            "POST /v2/models/m/infer?x=1 HTTP/1.1",
            "Host: a",
            "content-length:  007 ",
            f"Content-Type: {FORM.upper()}; charset=utf-8",
            "Inference-Header-Content-Length: 3",
            "X-Tab:\tv w\t",
        )
    )
    assert request.body_length == 7 and request.path == "/v2/models/m/infer"
    assert request.head == head(
        "POST /v2/models/m/infer?x=1 HTTP/1.1",
        "Host: a",
        "content-length: 7",
        "Content-Type: application/json",  # libevhtp never parses a body as a form
        "Inference-Header-Content-Length: 3",
        "X-Tab: v w",
    )


def test_what_passes() -> None:
    assert parse_request(head("GET /v2/health/live HTTP/1.1")).body_length == 0  # no Content-Length: no body
    assert parse_request(head("GET / HTTP/1.0", "Content-Length: 3")).body_length == 3
    at_the_limit = parse_request(post(f"Content-Length: {DEFAULT_MAX_BODY_BYTES}"))
    assert at_the_limit.body_length == DEFAULT_MAX_BODY_BYTES
    assert parse_request(post("Content-Length: 10", "Content-Type: application/json")).headers[-1][1] == (
        "application/json"
    )
    assert parse_request(post("Content-Length: 0", "Inference-Header-Content-Length: 0")).body_length == 0
    assert parse_request(post("Content-Length: 5", "X-Obs-Text: caf\xe9")).body_length == 5


REFUSED = {
    # The bug report's request: 8.4 MB of JSON as a form, with a small binary-header length.
    "reported_request": (
        post("Content-Length: 8400000", f"Content-Type: {FORM}", "Inference-Header-Content-Length: 10"),
        413,
    ),
    "over_the_limit": (post(f"Content-Length: {DEFAULT_MAX_BODY_BYTES + 1}"), 413),
    "over_the_limit_binary": (post("Content-Length: 6720312", "Inference-Header-Content-Length: 312"), 413),
    "duplicate_length_equal": (post("Content-Length: 5", "Content-Length: 5"), 400),
    "duplicate_length_differ": (post("Content-Length: 5", "Content-Length: 9000000"), 400),
    "negative_length": (post("Content-Length: -1"), 400),
    "plus_length": (post("Content-Length: +5"), 400),
    "hex_length": (post("Content-Length:  0x10"), 400),
    "exponent_length": (post("Content-Length: 1e3"), 400),
    "empty_length": (post("Content-Length:"), 400),
    "two_numbers": (post("Content-Length: 5 5"), 400),
    "superscript_digit": (post("Content-Length: \xb2"), 400),
    "nineteen_digits": (post("Content-Length: 1000000000000000000"), 400),
    "post_without_length": (post(), 411),
    "put_without_length": (head("PUT /v2/x HTTP/1.1"), 411),
    "chunked": (post("Transfer-Encoding: chunked"), 411),
    "chunked_with_length": (post("Content-Length: 5", "Transfer-Encoding: gzip, chunked"), 411),
    "identity_encoding": (post("Content-Length: 5", "Transfer-Encoding: identity"), 411),
    "duplicate_transfer_encoding": (post("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 400),
    "binary_header_too_large": (post("Content-Length: 5", "Inference-Header-Content-Length: 6"), 400),
    "binary_header_negative": (post("Content-Length: 5", "Inference-Header-Content-Length: -1"), 400),
    "binary_header_twice": (
        post("Content-Length: 5", "Inference-Header-Content-Length: 1", "Inference-Header-Content-Length: 1"),
        400,
    ),
    "binary_header_not_decimal": (post("Content-Length: 5", "Inference-Header-Content-Length: 0x1"), 400),
    "gzip_body": (post("Content-Length: 5", "Content-Encoding: gzip"), 415),
    "duplicate_content_type": (post("Content-Length: 5", f"Content-Type: {FORM}", "Content-Type: a/b"), 400),
    "duplicate_host": (post("Content-Length: 5", "Host: y"), 400),
    "obs_fold": (post("Content-Length: 5", "X-A: b", " Content-Length: 9"), 400),
    "tab_fold": (post("X-A: b", "\tc", "Content-Length: 5"), 400),
    "bare_lf": (post("X-A: b\nContent-Length: 9", "Content-Length: 5"), 400),
    "bare_cr": (post("X-A: b\rContent-Length: 9", "Content-Length: 5"), 400),
    "space_before_colon": (post("Content-Length : 5"), 400),
    "nul_in_value": (post("Content-Length: 5", "X-A: b\x00"), 400),
    "no_colon": (post("Content-Length: 5", "no colon here"), 400),
    "request_line_double_space": (head("GET  / HTTP/1.1"), 400),
    "request_line_http2": (head("GET / HTTP/2.0"), 400),
    "request_line_non_ascii": (head("GET /\xe9 HTTP/1.1"), 400),
    "request_line_lf": (head("GET / HTTP/1.1\nContent-Length: 5"), 400),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused(case: str) -> None:
    raw, status = REFUSED[case]
    with pytest.raises(HeadError) as info:
        parse_request(raw)
    assert info.value.status.startswith(str(status))


def test_the_limit_is_the_whole_body_whatever_the_headers_say() -> None:
    with pytest.raises(HeadError, match=r"the request body is 11 bytes; the limit is 10 bytes"):
        parse_request(post("Content-Length: 11", "Inference-Header-Content-Length: 1"), max_body_bytes=10)


# --- the guard in front of a tiny upstream -----------------------------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """Answers every request with 200 and the path; the server's `seen` lists (request line, headers, body)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer()

    do_POST = do_GET  # noqa: N815

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append((self.requestline, self.headers, body))
        payload = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def start_guard(upstream):
    guards: list[HttpGuard] = []

    def start(**options) -> HttpGuard:
        guard = HttpGuard("127.0.0.1", free_ports(1)[0], upstream.server_address, **options).start()
        guards.append(guard)
        return guard

    yield start
    for guard in guards:
        guard.stop()


def exchange(guard: HttpGuard, raw: bytes) -> bytes:
    return raw_http.exchange("127.0.0.1", guard.port, raw, timeout_s=10)


def statuses(data: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def request(guard: HttpGuard, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", guard.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Connection")
    finally:
        conn.close()


def test_keep_alive_requests_arrive_as_the_guard_wrote_them(start_guard, upstream) -> None:
    guard = start_guard()
    conn = http.client.HTTPConnection("127.0.0.1", guard.port, timeout=10)
    for i in range(3):  # one connection
        conn.request("POST", f"/v2/models/m/infer?i={i}", body=b'{"inputs": []}', headers={"Content-Type": FORM})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read()) == {"path": f"/v2/models/m/infer?i={i}"}
    conn.close()
    assert [body for _, _, body in upstream.seen] == [b'{"inputs": []}'] * 3
    assert all(headers.get_all("Content-Type") == ["application/json"] for _, headers, _ in upstream.seen)


def test_the_reported_request_never_reaches_the_upstream(start_guard, upstream) -> None:
    guard = start_guard()
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a" * 8_400_000]}]})
    headers = {"Content-Type": FORM, "Inference-Header-Content-Length": "10"}
    status, answer, connection = request(guard, "POST", "/v2/models/sentiment/infer", body.encode(), headers)
    assert status == 413 and "the limit is 2,097,152 bytes" in answer["error"] and connection == "close"
    assert upstream.seen == [] and guard.refused == 1
    assert request(guard, "GET", "/v2/health/ready")[0] == 200  # the next connection is served


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (post("Content-Length: 2", "Content-Length: 2") + b"{}", 400),
        (post() + b"{}", 411),
        (post("Transfer-Encoding: chunked") + b"2\r\n{}\r\n0\r\n\r\n", 411),
        (post("Content-Length: 2", "Content-Encoding: gzip") + b"{}", 415),
        (head("GET / HTTP/1.1", "X-Big: " + "a" * (70 << 10)), 431),
    ],
    ids=["duplicate_length", "no_length", "chunked", "gzip", "head_over_64_KiB"],
)
def test_refusals_over_the_wire(start_guard, upstream, raw: bytes, status: int) -> None:
    data = exchange(start_guard(), raw)
    assert statuses(data) == [status] and b"Connection: close" in data
    assert "error" in json.loads(data.partition(b"\r\n\r\n")[2])
    assert upstream.seen == []


def test_the_guard_s_own_answer_comes_after_the_upstream_s(start_guard, upstream) -> None:
    """Pipelined: a good request, then one to refuse; the answers arrive in order, then the connection closes."""
    good = post("Content-Length: 2") + b"{}"
    data = exchange(start_guard(), good + post("Content-Length: -2") + good)
    assert statuses(data) == [200, 400] and len(upstream.seen) == 1


def test_when_the_upstream_closes_so_does_the_client_s_connection(start_guard) -> None:
    """HTTP/1.0: the upstream answers and closes; the client, still sending nothing, sees the close."""
    guard = start_guard()
    with socket.create_connection(("127.0.0.1", guard.port), timeout=10) as sock:
        sock.sendall(head("GET /v2/health/ready HTTP/1.0"))
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    assert statuses(data) == [200] and data.endswith(b'{"path": "/v2/health/ready"}')


def test_an_unreachable_upstream_closes_the_connection_without_an_answer() -> None:
    """What a client sees while Triton is starting or restarting (the launcher's readiness polling relies on it)."""
    guard = HttpGuard("127.0.0.1", free_ports(1)[0], ("127.0.0.1", free_ports(1)[0])).start()
    try:
        assert exchange(guard, head("GET /v2/health/ready HTTP/1.1")) == b""
    finally:
        guard.stop()


def test_liveness_hook(start_guard, upstream) -> None:
    reason: list[str | None] = ["the Python stub of sentiment is dead"]
    calls = []

    def liveness() -> str | None:
        calls.append(1)
        return reason[0]

    guard = start_guard(liveness=liveness)
    for path in ("/v2/health/live", "/v2/health/live?verbose=1"):
        status, answer, connection = request(guard, "GET", path)
        assert (status, answer, connection) == (503, {"error": "the Python stub of sentiment is dead"}, "close")
    assert upstream.seen == [] and len(calls) == 2 and guard.refused == 0
    assert request(guard, "GET", "/v2/health/ready")[0] == 200  # other paths are not the hook's business
    assert request(guard, "POST", "/v2/health/live", b"")[0] == 200
    assert len(calls) == 2
    reason[0] = None  # live again: forwarded
    assert request(guard, "GET", "/v2/health/live")[:2] == (200, {"path": "/v2/health/live"})
    live = head("GET /v2/health/live HTTP/1.1", "Host: x")
    assert statuses(exchange(guard, live + live)) == [200, 200]  # keep-alive, forwarded


def test_liveness_hook_answers_after_earlier_requests_and_a_failing_hook_is_not_live(start_guard, upstream) -> None:
    def liveness() -> str | None:
        raise RuntimeError("watchdog gone")

    guard = start_guard(liveness=liveness)
    data = exchange(guard, head("GET /v2/health/ready HTTP/1.1") + head("GET /v2/health/live HTTP/1.1"))
    assert statuses(data) == [200, 503] and b"watchdog gone" in data
    assert request(guard, "GET", "/v2/health/ready")[0] == 200  # a new connection works
