"""Benchmarks: scripts that print timings and ratios measured in one run, never tests.

core.py times the engine's phases and compares it with its members alone (`python -m specfuse.bench`);
gpu.py times random-weight 7-9B members on a GPU (shapes.py builds them, gpu_workers.py builds one
and races bare decoding in turn, in threads and in processes, gpu_report.py prints the table);
concurrency.py members at once against in turn; remote.py served members against in-process ones;
serve.py many clients at once through the live API against one at a time; paused.py a running user
alone, beside a paused step-mode run and beside one stepping. Each is a subcommand of
`python -m specfuse.bench`.
"""
