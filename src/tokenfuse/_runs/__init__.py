"""Run budgets: ``tokenfuse.run(...)`` and what a guarded call does inside one.

* ``context``: the ``Run`` handle and the runs bound to the current context (contextvars);
* ``ledger``: reserving against every bound run (all or nothing), settling, the events;
* ``pricing``: dollars per model (``genai-prices``, or a table of the user's own).

docs/guards.md#run-budgets describes the guard.
"""
