"""The outbound side: an httpx/httpx2 transport that counts LLM tokens and stops loops."""

from .identity import current_scope, scope
from .meter import EXTENSION, FuseReport
from .refusal import find_refusal, unwrap_refusals
from .transport import AsyncFuseTransport, FuseTransport

__all__ = [
    "EXTENSION",
    "AsyncFuseTransport",
    "FuseReport",
    "FuseTransport",
    "current_scope",
    "find_refusal",
    "scope",
    "unwrap_refusals",
]
