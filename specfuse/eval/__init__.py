"""The evaluation: problems and their answers (problems.py; IFEval's rows and checker: ifeval.py),
systems and batched resumable runs (runs.py, variants.py), paired statistics (stats.py), the results
page (report.py) and the command line (cli.py; `python -m specfuse.eval --help`)."""
