"""The facade both sides decide through, and the values it takes and returns.

Most code never calls a ``Fuse`` directly: the transport and the middleware do. Call it to
guard something of your own, to read a key's status, or to change its limits live::

    from tokenfuse.fuse import Decision, Fuse

    fuse = Fuse()                                   # embedded store, default policy
    decision: Decision = fuse.record("agent-42", 1_200)
    decision.raise_if_refused()
    print(fuse.status("agent-42").rate)             # 1200.0

A key is named by a plain string (a name the application chose, shown as is) or by an
``Identity`` (``Identity.secret(api_key)`` is hashed and shown only redacted).
"""

from ._core.bucket import BucketVerdict
from ._fuse import Decision, Fuse, Status, default_fuse
from ._identity import Identity
from ._stats import FuseStats, UsageCounts

__all__ = [
    "BucketVerdict",
    "Decision",
    "Fuse",
    "FuseStats",
    "Identity",
    "Status",
    "UsageCounts",
    "default_fuse",
]
