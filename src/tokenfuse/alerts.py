"""Alerts: the events an operator pages on (trips, near-limit episodes), sent to a webhook.

::

    from tokenfuse.alerts import WebhookSink
    from tokenfuse.events import listen

    listen(WebhookSink("https://hooks.example.com/tokenfuse"))   # every fuse of the process

Logging stays the default sink: every event is logged on ``logging.getLogger("tokenfuse")``.
``TOKENFUSE_ALERT_WEBHOOK`` installs a webhook with no code.
"""

from ._alerts import ALERT_KINDS, WebhookSink, payload

__all__ = ["ALERT_KINDS", "WebhookSink", "payload"]
