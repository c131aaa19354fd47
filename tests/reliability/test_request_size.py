"""The HTTP guard in front of the real server: what Triton 2.51 would crash on is refused or neutralised, the
server keeps its pid, and ordinary requests are answered as before.

See serving/launcher/http_guard.py for the measurements; tests/test_http_guard.py holds the parsing rules without a
server. Texts over 1 MiB are refused by the front models on every protocol (serving/frontends/base.py).
"""

from __future__ import annotations

import http.client
import json
import re

import numpy as np
import pytest
import tritonclient.http as httpclient
from raw_http import exchange
from reliability_helpers import CLIENTS, connect, infer, text_input
from tritonclient.utils import InferenceServerException

from serving.launcher.http_guard import DEFAULT_MAX_BODY_BYTES

FORM = "application/x-www-form-urlencoded"  # what `curl -d` and urllib send
INFER = "/v2/models/sentiment/infer"


def post_json(server, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = server.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", INFER, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def infer_body(texts: list[str]) -> bytes:
    tensor = {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
    return json.dumps({"inputs": [tensor]}).encode()


def binary_body(texts: list[str]) -> tuple[bytes, int]:
    """A binary-tensor request body (JSON, then the BYTES tensor) and the length of its JSON part."""
    blobs = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    tensor = {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES"}
    tensor["parameters"] = {"binary_data_size": len(blobs)}
    json_part = json.dumps({"inputs": [tensor], "outputs": [{"name": "LABEL", "parameters": {"binary_data": False}}]})
    return json_part.encode() + blobs, len(json_part)


@pytest.fixture(scope="module")
def pid(triton) -> int:
    """The server's pid when this module starts: no request here may kill it (the launcher would restart it)."""
    return triton.pid


def assert_still_serving(server, pid: int) -> None:
    assert server.is_alive and server.pid == pid
    status, answer = post_json(server, infer_body(["这部电影不差"]))
    assert status == 200 and answer["outputs"][0]["data"] == ["positive"]


def test_the_reported_request_is_refused_and_the_server_lives(triton, pid: int) -> None:
    """The bug report: 8.4 MB of JSON as a form, with `Inference-Header-Content-Length: 10`. The guard used to
    check only those 10 bytes; Triton then died with SIGSEGV."""
    body = infer_body(["a" * 8_400_000])
    status, answer = post_json(triton, body, {"Content-Type": FORM, "Inference-Header-Content-Length": "10"})
    assert status == 413
    assert f"the request body is {len(body):,} bytes; the limit is {DEFAULT_MAX_BODY_BYTES:,} bytes" in answer["error"]
    assert_still_serving(triton, pid)


@pytest.mark.parametrize(("chars", "rows"), [(5_000_000, 1), (200_000, 32)])
def test_large_http_json_is_refused_with_413(triton, pid: int, chars: int, rows: int) -> None:
    status, answer = post_json(triton, infer_body(["a" * chars] * rows))
    assert status == 413 and f"the limit is {DEFAULT_MAX_BODY_BYTES:,} bytes" in answer["error"]
    assert_still_serving(triton, pid)


# One 2 MiB cap for every body, binary tensors included. Measured without the guard: 32 x 70,000 CJK characters
# as binary tensors (6,720,312 bytes) are answered with no content type but kill Triton with the form content type;
# 32 x 20,000 (1,920,312 bytes) are answered with either. The guard rewrites the form content type, so a larger
# binary cap would rest on that alone; nginx in compose caps every body at 2 MiB as well.
def test_binary_tensors_under_the_limit_are_fine(triton, pid: int) -> None:
    with connect(triton, "http") as client:
        tensor = httpclient.InferInput("TEXT", [32, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([["好" * 20_000]] * 32, dtype=np.object_), binary_data=True)
        assert client.infer("sentiment", [tensor]).as_numpy("LABEL").shape == (32, 1)
        tensor.set_data_from_numpy(np.array([["好" * 70_000]] * 32, dtype=np.object_), binary_data=True)
        with pytest.raises(InferenceServerException, match=f"the limit is {DEFAULT_MAX_BODY_BYTES:,} bytes"):
            client.infer("sentiment", [tensor])
    assert_still_serving(triton, pid)


def request(*headers: str, body: bytes = b"") -> bytes:
    lines = [f"POST {INFER} HTTP/1.1", "Host: x", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


BODY = infer_body(["很好"])
N = len(BODY)
REFUSED = {
    "duplicate_length_equal": (request(f"Content-Length: {N}", f"Content-Length: {N}", body=BODY), 400),
    "duplicate_length_differ": (request(f"Content-Length: {N}", "Content-Length: 5000000", body=BODY), 400),
    "negative_length": (request("Content-Length: -1", body=BODY), 400),
    "plus_length": (request(f"Content-Length: +{N}", body=BODY), 400),
    "hex_length": (request("Content-Length:  0x10", body=BODY), 400),
    "exponent_length": (request("Content-Length: 1e3", body=BODY), 400),
    "post_without_length": (request(body=BODY), 411),
    "chunked": (request("Transfer-Encoding: chunked", body=b"5\r\nhello\r\n0\r\n\r\n"), 411),
    "chunked_and_length": (request(f"Content-Length: {N}", "Transfer-Encoding: chunked", body=BODY), 411),
    "duplicate_transfer_encoding": (request("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 400),
    "binary_header_over_body": (
        request(f"Content-Length: {N}", f"Inference-Header-Content-Length: {N + 1}", body=BODY),
        400,
    ),
    "binary_header_negative": (request(f"Content-Length: {N}", "Inference-Header-Content-Length: -1", body=BODY), 400),
    "binary_header_twice": (
        request(
            f"Content-Length: {N}",
            f"Inference-Header-Content-Length: {N}",
            f"Inference-Header-Content-Length: {N}",
            body=BODY,
        ),
        400,
    ),
    "obs_fold": (request(f"Content-Length: {N}", "X-A: b", " Content-Length: 5000000", body=BODY), 400),
    "bare_lf": (request("X-A: b\nContent-Length: 5000000", f"Content-Length: {N}", body=BODY), 400),
    "space_before_colon": (request(f"Content-Length : {N}", body=BODY), 400),
    "gzip_body": (request(f"Content-Length: {N}", "Content-Encoding: gzip", body=BODY), 415),
}


@pytest.mark.parametrize("case", REFUSED)
def test_malformed_requests_are_refused_and_the_server_lives(triton, pid: int, case: str) -> None:
    raw, status = REFUSED[case]
    host, port = triton.http_address.rsplit(":", 1)
    data = exchange(host, int(port), raw)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [str(status).encode()]
    assert "error" in json.loads(data.partition(b"\r\n\r\n")[2])
    assert_still_serving(triton, pid)


def test_curl_d_requests_are_answered(triton, pid: int) -> None:
    """`curl -d` sends the form content type; the guard passes it on as application/json."""
    status, answer = post_json(triton, infer_body(["这部电影不差", "服务一点也不好"]), {"Content-Type": FORM})
    assert status == 200 and answer["outputs"][0]["data"] == ["positive", "negative"]
    assert_still_serving(triton, pid)


def test_the_form_content_type_never_reaches_triton(start_server) -> None:
    """With the cap raised past the crash size, the bodies that kill an unguarded Triton as forms are answered:
    Triton gets application/json (serving/launcher/http_guard.py: 6.7 MB binary and 8.4 MB JSON forms crash it)."""
    server = start_server(["sentiment", "sentiment_encoder"], max_http_body_bytes=16 << 20)
    pid = server.pid
    body, json_size = binary_body(["好" * 70_000] * 32)
    status, answer = post_json(server, body, {"Content-Type": FORM, "Inference-Header-Content-Length": str(json_size)})
    assert status == 200 and answer["outputs"][0]["shape"] == [32, 1]
    status, answer = post_json(server, infer_body(["a" * 8_400_000]), {"Content-Type": FORM})
    assert status == 400 and "TEXT[0] is 8,400,000 bytes" in answer["error"]  # refused by the model, not a crash
    assert_still_serving(server, pid)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_text_over_one_mib_is_refused_by_name(triton, protocol: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client, pytest.raises(InferenceServerException, match=r"TEXT\[0\] is 1,050,000"):
        tensor = module.InferInput("TEXT", [1, 1], "BYTES")
        data = np.array([["好" * 350_000]], dtype=np.object_)
        tensor.set_data_from_numpy(data, **({"binary_data": True} if protocol == "http" else {}))
        infer(client, "sentiment", [tensor])


def test_keep_alive_connections_carry_many_requests(triton) -> None:
    with connect(triton, "http") as client:  # one connection, requests one after another
        for text in ["这部电影不差", "服务一点也不好", "还行"]:
            assert infer(client, "sentiment", [text_input(httpclient, [text])]).as_numpy("LABEL").shape == (1, 1)


def test_without_the_guard_4200_kib_of_json_kills_triton(start_server) -> None:
    """Why the guard exists (the numbers in docs/reliability.md's security table): sent as `curl -d` sends it,
    Triton 2.51 answers a 3,900 KiB body and dies with SIGSEGV on 4,200 KiB."""
    server = start_server(["sentiment", "sentiment_encoder"], http_guard=False)
    assert post_json(server, infer_body(["a" * (4200 << 10)]))[0] == 400  # JSON content type: answered
    assert post_json(server, infer_body(["a" * (3900 << 10)]), {"Content-Type": FORM})[0] == 400
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        post_json(server, infer_body(["a" * (4200 << 10)]), {"Content-Type": FORM})
    assert server.process.wait(timeout=30) == -11  # SIGSEGV
