"""Request-size limits: what Triton 2.51 would crash on (HTTP JSON over ~4 MB) is refused, nothing else changes.

See serving/http_guard.py for the measurement. Texts over 1 MiB are refused by the front models on every
protocol (serving/frontends/base.py).
"""

from __future__ import annotations

import http.client
import json
import socket

import numpy as np
import pytest
import tritonclient.http as httpclient
from reliability_helpers import CLIENTS, connect, infer, text_input
from tritonclient.utils import InferenceServerException

from serving.http_guard import DEFAULT_MAX_JSON_BYTES, HeadError, body_length, parse_head


def post_json(server, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = server.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v2/models/sentiment/infer", body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def infer_body(texts: list[str]) -> bytes:
    tensor = {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
    return json.dumps({"inputs": [tensor]}).encode()


@pytest.mark.parametrize(("chars", "rows"), [(5_000_000, 1), (200_000, 32)])
def test_large_http_json_is_refused_with_413_and_the_server_lives(triton, chars: int, rows: int) -> None:
    status, answer = post_json(triton, infer_body(["a" * chars] * rows))
    assert status == 413
    assert f"the limit is {DEFAULT_MAX_JSON_BYTES:,} bytes" in answer["error"]
    assert triton.is_alive
    assert post_json(triton, infer_body(["这部电影不差"]))[0] == 200


def test_binary_tensors_of_the_same_size_are_fine(triton) -> None:
    with connect(triton, "http") as client:
        tensor = httpclient.InferInput("TEXT", [32, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([["好" * 70_000]] * 32, dtype=np.object_), binary_data=True)
        assert client.infer("sentiment", [tensor]).as_numpy("LABEL").shape == (32, 1)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_text_over_one_mib_is_refused_by_name(triton, protocol: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client, pytest.raises(InferenceServerException, match=r"TEXT\[0\] is 3,145,"):
        tensor = module.InferInput("TEXT", [1, 1], "BYTES")
        data = np.array([["好" * (1 << 20)]], dtype=np.object_)
        tensor.set_data_from_numpy(data, **({"binary_data": True} if protocol == "http" else {}))
        infer(client, "sentiment", [tensor])


def test_chunked_bodies_are_refused(triton) -> None:
    host, port = triton.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/sentiment/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n"
        )
        assert sock.recv(200).startswith(b"HTTP/1.1 411")


def test_keep_alive_connections_carry_many_requests(triton) -> None:
    with connect(triton, "http") as client:  # one connection, requests one after another
        for text in ["这部电影不差", "服务一点也不好", "还行"]:
            assert infer(client, "sentiment", [text_input(httpclient, [text])]).as_numpy("LABEL").shape == (1, 1)


def test_head_parsing() -> None:
    head = b"POST /v2 HTTP/1.1\r\nContent-Length: 10\r\nInference-Header-Content-Length: 4\r\n\r\n"
    headers = parse_head(head)
    assert headers["content-length"] == "10" and body_length(headers, max_json_bytes=5) == 10
    with pytest.raises(HeadError, match="413|JSON is 10"):
        body_length(parse_head(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n"), max_json_bytes=5)
    with pytest.raises(HeadError, match="integer"):
        body_length({"content-length": "ten"}, max_json_bytes=5)
    with pytest.raises(HeadError, match="malformed"):
        parse_head(b"POST / HTTP/1.1\r\nno colon here\r\n\r\n")


def test_without_the_guard_4200_kib_of_json_kills_triton(start_server) -> None:
    """Why the guard exists (the numbers in README's security table): sent as `curl -d` sends it, Triton 2.51
    answers a 3,900 KiB body and dies with SIGSEGV on 4,200 KiB."""
    server = start_server(["sentiment", "sentiment_encoder"], http_guard=False)
    assert post_json(server, infer_body(["a" * (4200 << 10)]))[0] == 400  # JSON content type: answered
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` and urllib send
    assert post_json(server, infer_body(["a" * (3900 << 10)]), form)[0] == 400
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        post_json(server, infer_body(["a" * (4200 << 10)]), form)
    assert server.process.wait(timeout=30) == -11  # SIGSEGV
