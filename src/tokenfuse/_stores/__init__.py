"""Stores keep per-key state and run each decision atomically (see ``base.Store``)."""
