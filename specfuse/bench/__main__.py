"""`python -m specfuse.bench [gpu|concurrency|remote|serve|paused|followup|backends|equality|
prefill-gap|room] …`: one command for every benchmark; without a subcommand it runs the engine's own
benchmark (core.py)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = {
    "gpu": "specfuse.bench.gpu",
    "concurrency": "specfuse.bench.concurrency",
    "remote": "specfuse.bench.remote",
    "serve": "specfuse.bench.serve",
    "paused": "specfuse.bench.paused",
    "followup": "specfuse.bench.followup",
    "backends": "specfuse.bench.backends",
    "equality": "specfuse.bench.equality",
    "prefill-gap": "specfuse.bench.prefill_gap",
    "room": "specfuse.bench.room",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    module = "specfuse.bench.core"
    if args and args[0] in SUBCOMMANDS:
        module = SUBCOMMANDS[args.pop(0)]
    elif args and args[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nsubcommands: " + ", ".join(SUBCOMMANDS) + "; the engine's own:\n")
    result: int = importlib.import_module(module).main(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
