"""The ``tokenfuse`` command line (``app.main``); ``python -m tokenfuse`` runs it too."""

from .app import main

__all__ = ["main"]
