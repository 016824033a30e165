"""Trace files and what is read back from them: the format, its schema, reports, hostile input."""
