"""Inbound containment: ``TokenFuse`` (ASGI) and ``TokenFuseWSGI`` in front of tool endpoints.

::

    request ─ RequestView ─ Guard.plan ─ Fuse.admit/aadmit ─ Guard.settle ─┬─ Reply (429)
                (request.py) (policy.py)      (one store trip)  (policy.py) └─ app + headers
                                                                               │
                              count="tokens": Report (report.py) ─ Fuse.record/arecord

``asgi.py`` and ``wsgi.py`` differ only in how they speak their protocol.
"""

from .asgi import TokenFuse
from .defaults import CALL_VELOCITY, default_inbound_fuse, inbound_fuse
from .identify import ANONYMOUS, bearer_or_api_key, by_header
from .policy import Reply
from .report import DECISION_KEY, REPORT_KEY, TOKENS_HEADER, report_tokens
from .request import RequestView
from .wsgi import TokenFuseWSGI

__all__ = [
    "ANONYMOUS",
    "CALL_VELOCITY",
    "DECISION_KEY",
    "REPORT_KEY",
    "TOKENS_HEADER",
    "Reply",
    "RequestView",
    "TokenFuse",
    "TokenFuseWSGI",
    "bearer_or_api_key",
    "by_header",
    "default_inbound_fuse",
    "inbound_fuse",
    "report_tokens",
]
