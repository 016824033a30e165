"""The evaluation (specfuse.eval) and the tools that read its runs."""
