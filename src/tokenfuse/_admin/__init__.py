"""The operator's side: keys listed and addressed, live changes, events (``Admin``)."""
