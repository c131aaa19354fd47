"""What every route shares: the keys, the models behind the gateway and the metrics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from .fields import Fields, presented_key
from .keys import Account, Keys
from .metrics import GatewayMetrics
from .service import Triton


@dataclass
class GatewayState:
    keys: Keys
    triton: Triton
    metrics: GatewayMetrics

    def authenticate(self, request: Request, fields: Fields) -> Account:
        """The caller's account, one request counted against its rate (403 without a valid key when keys are
        configured, 429 over the rate); metrics see its id."""
        account = self.keys.authenticate(presented_key(request, fields))
        request.state.key_id = account.id
        self.keys.take_request(account)
        return account

    @contextlib.asynccontextmanager
    async def metered(self, account: Account, characters: int) -> AsyncIterator[None]:
        """Around the work for `characters` source characters: 456 before it when they would pass the key's
        quota; charged after it, only when it succeeded."""
        self.keys.check_characters(account, characters)
        yield
        self.keys.charge(account, characters)
        self.metrics.characters.labels(account.id).inc(characters)


def state_of(request: Request) -> GatewayState:
    return request.app.state.gateway
