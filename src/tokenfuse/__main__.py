"""``python -m tokenfuse``: the ``tokenfuse`` command line."""

from ._cli import main

raise SystemExit(main())
