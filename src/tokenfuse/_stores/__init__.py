"""Stores keep per-key state and run operations on it (``ops``), each atomically (``base``)."""
