"""The batching front models' own bounded queue (serving/frontends/waiting.py), without a server."""

from __future__ import annotations

import threading

import pytest

from serving.frontends.waiting import RequestQueue, Waiting, queue_bound


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def waiting(texts: int, arrived: float = 100.0) -> Waiting:
    return Waiting(sender=None, texts=["x"] * texts, options=(), arrived=arrived)


def test_put_refuses_what_does_not_fit_and_keeps_the_order():
    queue = RequestQueue(max_size=3, timeout_s=1, clock=Clock())
    items = [waiting(1) for _ in range(5)]
    assert queue.put(items[:2]) == []
    assert queue.put(items[2:]) == items[3:]  # one place left
    assert len(queue) == 3
    fresh, expired = queue.take(max_rows=10)
    assert fresh == items[:3] and expired == []


def test_take_stops_at_max_rows_but_always_takes_one():
    queue = RequestQueue(max_size=10, timeout_s=1, clock=Clock())
    big, small = waiting(9), waiting(2)
    queue.put([big, small, waiting(1)])
    assert queue.take(max_rows=4) == ([big], [])  # more rows than max_rows alone: still served
    fresh, _ = queue.take(max_rows=4)
    assert [len(item.texts) for item in fresh] == [2, 1]


def test_requests_that_waited_past_the_timeout_come_out_apart():
    clock = Clock()
    queue = RequestQueue(max_size=10, timeout_s=1, clock=clock)
    old, new = waiting(1, arrived=98.0), waiting(1, arrived=99.5)
    queue.put([old, new])
    assert queue.take(max_rows=8) == ([new], [old])


def test_close_hands_out_what_is_left_then_none_and_refuses_more():
    queue = RequestQueue(max_size=10, timeout_s=1, clock=Clock())
    item = waiting(1)
    queue.put([item])
    queue.close()
    assert queue.put([waiting(1)]) != []
    assert queue.take(8) == ([item], [])
    assert queue.take(8) is None


def test_take_waits_for_a_request():
    queue = RequestQueue(max_size=10, timeout_s=1)
    got = []
    taker = threading.Thread(target=lambda: got.append(queue.take(8)))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive() and not got  # nothing to take yet
    queue.put([Waiting(sender=None, texts=["x"], options=())])  # arrived now
    taker.join(5)
    assert got and len(got[0][0]) == 1


def test_queue_bound_shares_the_model_queue_between_instances_and_names_what_is_missing():
    parameters = {"queue_max_size": "256", "queue_timeout_s": "1.5"}
    assert queue_bound(parameters, instances=2) == (128, 1.5)
    assert queue_bound(parameters, instances=3) == (86, 1.5)
    assert queue_bound({}, instances=2, required=False) is None
    with pytest.raises(ValueError, match="queue_timeout_s"):
        queue_bound({"queue_max_size": "4"}, instances=1)
    with pytest.raises(ValueError, match="max_size >= 1"):
        RequestQueue(max_size=0, timeout_s=1)
