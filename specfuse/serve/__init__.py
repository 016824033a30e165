"""Serving many people at once: one scheduler over the loaded members (scheduler.py) and an
OpenAI-compatible HTTP API in front of it (api.py, started by `python -m specfuse.serve`).

Knows nothing about the app's panels; the app calls the scheduler like any other client.
"""
