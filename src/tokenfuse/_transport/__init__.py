"""The outbound side: an httpx/httpx2 transport that counts LLM tokens and stops loops."""

from .._errors import FailureLoop
from .._loops import FailureLoopPolicy, aforget_loops, forget_loops
from .identity import current_scope, scope
from .meter import EXTENSION, FuseReport
from .refusal import find_refusal, unwrap_refusals
from .transport import AsyncFuseTransport, FuseTransport

__all__ = [
    "EXTENSION",
    "AsyncFuseTransport",
    "FailureLoop",
    "FailureLoopPolicy",
    "FuseReport",
    "FuseTransport",
    "aforget_loops",
    "current_scope",
    "find_refusal",
    "forget_loops",
    "scope",
    "unwrap_refusals",
]
