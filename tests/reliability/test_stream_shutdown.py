"""gRPC streams through the SDK, finished and abandoned, leave nothing behind: the server stops cleanly after them.

Triton 2.51 mishandles a cancelled gRPC stream (clients/streaming.py `_end_stream`, docs/reliability.md): a stream
cancelled after its final response keeps its model from unloading, so stopping the server waits out the whole exit
timeout and exits 1, and streams cancelled mid-answer crash it. The SDK never cancels a stream; this burst, with a
fifth of its streams abandoned after their first piece, must leave a server that unloads every model and exits 0
well within the exit timeout.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

from clients import Client

TEXTS = [
    "我们明天去北京看长城。",
    "他每天早上六点起床，然后去公园跑步。",
    "请把窗户关上。",
    "这家餐厅的菜很好吃，但是服务太慢了。",
]
STREAMS = 200
EXIT_TIMEOUT_S = 30


def test_a_burst_of_grpc_streams_leaves_a_server_that_stops_cleanly(start_server):
    server = start_server(["translate_stream"], exit_timeout_s=EXIT_TIMEOUT_S)

    def one(i: int) -> str:
        with Client(server.grpc_url, retry=None) as client:
            pieces = client.stream("translate", TEXTS[i % len(TEXTS)], num_beams=1)
            if i % 5 == 0:  # abandoned after the first piece: the rest is read in the background
                first = next(pieces)
                pieces.close()
                return first
            return "".join(pieces)

    with cf.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(STREAMS)))
    assert all(answers), "every stream, abandoned or not, delivered text"
    time.sleep(1)  # the abandoned streams' rest is read in the background
    assert server.is_alive, f"the server died during the burst:\n{server.log_tail()}"

    started = time.monotonic()
    code = server.stop()
    took = time.monotonic() - started
    assert code == 0, f"tritonserver exited {code} after {took:.1f} s:\n{server.log_tail()}"
    assert took < EXIT_TIMEOUT_S / 2, f"stopping took {took:.1f} s: a model waited to unload"
