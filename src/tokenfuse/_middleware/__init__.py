"""Inbound containment: ``TokenFuse`` (ASGI) and ``TokenFuseWSGI`` in front of tool endpoints.

::

    request ─ RequestView ─ InboundGuard.plan ─ InboundGuard.aadmit/admit ─ settle ─┬─ Reply
             (request.py)      (guard.py)       (one store trip: the Admit   (guard.py) │
                                                 and the failure-loop check)            └─ app
    count="tokens": the app reports into the Outcome's Report (report.py), which
                    InboundGuard.arecord/record files in the store when the response is done

``options.py`` declares and checks the options, ``shell.py`` is the constructor both
middleware classes share, and ``asgi.py`` / ``wsgi.py`` differ only in how they speak their
protocol. ``reply.py`` formats what the middleware answers, ``identify.py`` turns a request
into an ``Identity`` (``clients.py``: the client address, for callers without one), and
``defaults.py`` is what a ``TokenFuse`` without options enforces. With ``lease=True``, a Plan
admits through ``tokenfuse._leases.Leases``: most calls then make no store trip at all.
"""

from .._core.lease import LeasePolicy
from .._leases import LeaseCounts, Leases
from .asgi import TokenFuse
from .defaults import CALL_VELOCITY, default_inbound_fuse, inbound_fuse
from .identify import ANONYMOUS, IdentifyRequest, bearer_or_api_key, by_header, verified
from .options import InboundOptions
from .reply import Reply
from .report import DECISION_KEY, REPORT_KEY, TOKENS_HEADER, report_tokens
from .request import RequestView
from .wsgi import TokenFuseWSGI

__all__ = [
    "ANONYMOUS",
    "CALL_VELOCITY",
    "DECISION_KEY",
    "REPORT_KEY",
    "TOKENS_HEADER",
    "IdentifyRequest",
    "InboundOptions",
    "LeaseCounts",
    "LeasePolicy",
    "Leases",
    "Reply",
    "RequestView",
    "TokenFuse",
    "TokenFuseWSGI",
    "bearer_or_api_key",
    "by_header",
    "default_inbound_fuse",
    "inbound_fuse",
    "report_tokens",
    "verified",
]
