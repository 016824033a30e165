"""The command line run in-process, for the tests of its commands (project/test_cli, models/test_quantize)."""

from __future__ import annotations

import io

from specfuse.cli import main


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()
