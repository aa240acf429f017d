"""The admin app: a JSON API and a live web page over one fuse's keys (``tokenfuse.admin.app``).

``service`` answers the queries (``Panel``), ``history`` keeps each key's last hour as the app
sees it, ``auth`` decides who may ask, ``web`` is the Starlette app and ``static`` the page.
Only ``web`` needs Starlette.
"""
