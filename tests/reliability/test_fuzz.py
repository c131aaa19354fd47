"""Property test: random bytes and option values never crash, hang or kill anything.

Hypothesis sends 600 requests to the session server: 1–3 rows of arbitrary bytes or text, to a random endpoint,
over gRPC or HTTP, with optional inputs in and out of range. Every request must get either a well-formed answer or
a client error (INVALID_ARGUMENT / HTTP 400) with a message; afterwards the server is live and ready, no Python
stub was restarted (same pids, no watchdog reload) and nothing was left in the queues.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_helpers import CLIENTS, OUTPUT, connect, infer, int_input, stub_pids, text_input
from tritonclient.utils import InferenceServerException

EXAMPLES = 600
CLIENT_ERRORS = ("StatusCode.INVALID_ARGUMENT", "400")

rows = st.one_of(
    st.binary(max_size=48),
    st.text(max_size=24).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from(["我爱你。", "这部电影不差", "😀", " ", "\x00"]).map(str.encode),
)
# Mostly cheap settings (a junk text decoded with 8 beams and 96 tokens costs real CPU); the edges are in range.
new_tokens = st.one_of(st.none(), st.integers(-3, 6), st.sampled_from([0, 1, 96, 97, 80, 81, 2**31 - 1, -(2**31)]))
beams = st.one_of(st.none(), st.integers(-2, 10), st.sampled_from([2**31 - 1, -(2**31)]))
requests = st.tuples(
    st.sampled_from(["sentiment", "translate", "summarize"]),
    st.sampled_from(["grpc", "http"]),
    st.lists(rows, min_size=1, max_size=3),
    new_tokens,
    beams,
)


def test_random_requests_get_an_answer_or_a_clear_error(triton) -> None:
    before = stub_pids(triton)
    clients = {protocol: connect(triton, protocol) for protocol in CLIENTS}
    outcomes = {"answered": 0, "refused": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(requests)
    def one_request(request) -> None:
        model, protocol, texts, max_new_tokens, num_beams = request
        module = CLIENTS[protocol]
        inputs = [text_input(module, texts)]
        if model != "sentiment":
            for name, value in (("MAX_NEW_TOKENS", max_new_tokens), ("NUM_BEAMS", num_beams)):
                if value is not None:
                    inputs.append(int_input(module, name, value, len(texts)))
        try:
            result = infer(clients[protocol], model, inputs, timeout_s=120)
        except InferenceServerException as err:
            assert str(err.status()) in CLIENT_ERRORS, f"{model} {protocol}: {err.status()} {err.message()}"
            assert any(field in err.message() for field in ("TEXT", "MAX_NEW_TOKENS", "NUM_BEAMS")), err.message()
            outcomes["refused"] += 1
            return
        out = result.as_numpy(OUTPUT[model])
        assert out.shape == (len(texts), 1)
        if model == "sentiment":
            assert set(out[:, 0]) <= {b"positive", b"negative"}
            assert np.all((result.as_numpy("SCORE") >= 0.5) & (result.as_numpy("SCORE") <= 1.0))
        outcomes["answered"] += 1

    try:
        one_request()
    finally:
        for client in clients.values():
            client.close()
    print(f"\nfuzz: {outcomes}")
    assert outcomes["answered"] + outcomes["refused"] >= EXAMPLES
    assert outcomes["answered"] > 50 and outcomes["refused"] > 50, outcomes  # both paths really exercised
    with connect(triton, "http") as client:
        assert client.is_server_live() and client.is_server_ready()
    assert stub_pids(triton) == before, "a Python stub died or was restarted"
    assert triton.watchdog is not None and triton.watchdog.reloads == {}
