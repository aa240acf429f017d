"""The admin app of a fuse on Redis, configured from the environment, for a real server:

    ADMIN_REDIS_URL=redis://127.0.0.1:6379/15 ADMIN_PREFIX=p ADMIN_TOKEN=t \\
        python -m uvicorn tests.admin.admin_server:app --port 8787
"""

from __future__ import annotations

import os
from typing import Any

from tokenfuse import BucketPolicy, Fuse, VelocityPolicy

#: The policy of the fuse the browser test drives: the defaults, a bucket, a short cooldown.
POLICY = VelocityPolicy(cooldown=600)
BUCKET = BucketPolicy(rate=5, capacity=50)


def fuse(**store_options: Any) -> Fuse:
    """The fuse of the environment's Redis and prefix (``store_options``: e.g. a clock)."""
    from tokenfuse.stores import RedisStore

    store = RedisStore.from_url(
        os.environ["ADMIN_REDIS_URL"], prefix=os.environ["ADMIN_PREFIX"], **store_options
    )
    return Fuse(store, name="inbound", velocity=POLICY, bucket=BUCKET)


app: Any = None
if "ADMIN_TOKEN" in os.environ:
    import tokenfuse.admin

    app = tokenfuse.admin.app(fuse(), token=os.environ["ADMIN_TOKEN"], refresh=1.0)
