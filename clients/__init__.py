"""Python SDK and CLI for the ropeserve Triton models (`sentiment`, `translate`, `summarize`).

See `clients.client` for the conventions (batches in, lists out, errors, retries)
and `python -m clients --help` for the command line.
"""

from .client import AsyncClient, Client
from .endpoints import Sentiment
from .errors import ClientError, ServerUnreachable, Status
from .explain import SentimentAttention, TranslationAlignment
from .retry import RetryPolicy

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "RetryPolicy",
    "Sentiment",
    "SentimentAttention",
    "ServerUnreachable",
    "Status",
    "TranslationAlignment",
]
