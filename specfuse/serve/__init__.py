"""Serving many people at once over HTTP: an OpenAI-compatible API (api.py, its bodies in schema.py
and ask.py, started by `python -m specfuse.serve`, cli.py) in front of the engine's Scheduler
(specfuse.engine).

HTTP only: the batch, its thread and the line are the engine's; the app calls the same Scheduler.
"""
