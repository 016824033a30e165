"""The project's shape: layout rules, docs, results, packaging, flags and the CLI."""
