"""The benchmarks (specfuse.bench) on tiny members: every figure exists and every mode runs."""
