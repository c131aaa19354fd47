"""Retry with capped exponential backoff and full jitter.

All three endpoints are pure functions of their inputs, so repeating a request is safe. We retry only what a
second try can fix: an overloaded server (gRPC UNAVAILABLE, HTTP 503/429) and a server we could not reach yet
(restarting, still loading models). Everything else (bad input, timeouts) fails at once: retrying a timeout
would pile more work onto a server that is already too slow.

Full jitter (delay drawn uniformly from [0, cap]) spreads out clients that failed at the same moment, so they
do not come back as one synchronized wave (AWS Architecture Blog, "Exponential Backoff And Jitter").
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import ClientError, ServerUnreachable, Status

T = TypeVar("T")

log = logging.getLogger("ropeserve.client")  # one INFO record per retry: what failed and how long we wait

DRAINING_MESSAGE = "has no available versions"
DEFAULT_RETRY_CODES: frozenset[Status] = frozenset({Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED})


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a failed request again.

    `max_attempts` counts the first try: 1 turns retrying off (see `RetryPolicy.disabled()`). The wait before
    retry number k (1-based) is ``min(max_delay_s, base_delay_s * 2 ** (k - 1))``, drawn uniformly from
    ``[0, that]`` when `jitter` is on. The default (3 attempts, 0.1 s base, 2 s cap) adds at most 0.3 s.
    """

    max_attempts: int = 3
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0
    jitter: bool = True
    retry_codes: frozenset[Status] = DEFAULT_RETRY_CODES
    retry_unreachable: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("retry delays must be >= 0")

    @classmethod
    def disabled(cls) -> RetryPolicy:
        """A policy that never retries."""
        return cls(max_attempts=1)

    def delay_cap(self, retry_number: int) -> float:
        """Upper bound of the wait before retry `retry_number` (1 = the first retry)."""
        if retry_number < 1:
            raise ValueError(f"retry_number starts at 1, got {retry_number}")
        exponent = min(retry_number - 1, 62)  # 2**62 already exceeds any sane cap; avoids float overflow
        return min(self.max_delay_s, self.base_delay_s * 2.0**exponent)

    def delay(self, retry_number: int, rng: random.Random | None = None) -> float:
        """The wait before retry `retry_number`: the cap itself, or uniform in [0, cap] with jitter."""
        cap = self.delay_cap(retry_number)
        return (rng or random).uniform(0.0, cap) if self.jitter else cap

    def is_retryable(self, error: ClientError) -> bool:
        """Whether a second try could succeed where this one failed."""
        if isinstance(error, ServerUnreachable) or error.code is Status.UNREACHABLE:
            return self.retry_unreachable
        # A server that is draining (serving.launcher.drain) has unloaded its endpoints: another replica, or this one
        # restarted, will answer. Triton says so with NOT_FOUND over gRPC but 400 over HTTP, where only this
        # message tells it from bad input.
        if self.retry_unreachable and error.code in (Status.NOT_FOUND, Status.INVALID_ARGUMENT):
            return DRAINING_MESSAGE in error.message
        return error.code in self.retry_codes

    @staticmethod
    def reconnects(error: ClientError) -> bool:
        """Whether the next attempt should open a new connection: the server is gone or going away (draining). A
        kept-alive connection would take the retry to the same replica; a new one asks DNS again, which no longer
        names a replica that is shutting down (Docker swarm, Kubernetes headless services)."""
        return (
            isinstance(error, ServerUnreachable)
            or error.code is Status.UNREACHABLE
            or DRAINING_MESSAGE in error.message
        )

    def next_delay(self, error: ClientError, attempt: int, rng: random.Random | None = None) -> float | None:
        """Seconds to wait after failed attempt number `attempt` (1-based), or None to give up and raise."""
        if attempt >= self.max_attempts or not self.is_retryable(error):
            return None
        return self.delay(attempt, rng)


def call_with_retry(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    sleep: Callable[[float], object] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Run `attempt` until it succeeds or `policy` gives up; `attempt` must raise `ClientError` on failure."""
    attempt_number = 1
    while True:
        try:
            return attempt()
        except ClientError as error:
            wait_s = policy.next_delay(error, attempt_number, rng)
            if wait_s is None:
                raise
            _log_retry(error, attempt_number, wait_s)
        sleep(wait_s)
        attempt_number += 1


async def call_with_retry_async(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> T:
    """`call_with_retry` for coroutines: same decisions, but waits without blocking the event loop."""
    attempt_number = 1
    while True:
        try:
            return await attempt()
        except ClientError as error:
            wait_s = policy.next_delay(error, attempt_number, rng)
            if wait_s is None:
                raise
            _log_retry(error, attempt_number, wait_s)
        await sleep(wait_s)
        attempt_number += 1


def _log_retry(error: ClientError, attempt: int, wait_s: float) -> None:
    log.info("attempt %d failed (%s); retrying in %.3f s", attempt, error, wait_s)
