"""Interleaved A/B of the engine's benchmark with and without some settings: `python -m specfuse.bench
--quick [options]` as it is (A) and with `--set KEY=VALUE …` on top (B), alternating, so that the
machine's drift hits both. Prints each run's ms per token, phase shares and each member's verify and
draft ms a round, then the medians and their ratio. Run it alone on the machine.

Usage: python tools/ab_settings.py --set KEY=VALUE [--set …] [--repeats 2] [--json OUT] [-- bench options]
       e.g. python tools/ab_settings.py --set own_draft_scores=true -- --quantize gguf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(options: list[str], out: Path) -> dict:
    command = [sys.executable, "-m", "specfuse.bench", "--quick", *options, "--json", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def figures(report: dict) -> dict:
    members = report["phase_ms_per_member"]
    return {
        "ms_per_token": 1000 * report["ensemble_s_per_token"],
        "draft_share": report["draft_share"],
        "verify_share": report["verify_share"],
        "answer_chars": report["answer_chars"],
        "verify_ms": {m: v["verify_s"] for m, v in members.items()},
        "draft_ms": {m: v["draft_s"] for m, v in members.items()},
        "load": os.getloadavg()[0],
    }


def main() -> None:
    argv = sys.argv[1:]
    bench_options = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", dest="settings", action="append", required=True, metavar="KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternated (default 2)")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args(argv)
    sides = {"A": bench_options, "B": [*bench_options, *(f"--set={s}" for s in args.settings)]}
    print(
        f"bench --quick {' '.join(bench_options)}; B adds {' '.join(args.settings)}; load {os.getloadavg()}"
    )
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for side, options in sides.items():
                got = figures(run(options, Path(tmp) / f"{side}-{i}.json"))
                results[side].append(got)
                verify = " / ".join(f"{v:.0f}" for v in got["verify_ms"].values())
                draft = " / ".join(f"{v:.0f}" for v in got["draft_ms"].values())
                print(
                    f"{side} {i + 1}: {got['ms_per_token']:.1f} ms/token; "
                    f"shares draft {got['draft_share']:.3f} verify {got['verify_share']:.3f}; "
                    f"ms a round, verify {verify}, draft {draft} "
                    f"({', '.join(got['verify_ms'])}); {got['answer_chars']} chars; load {got['load']:.2f}",
                    flush=True,
                )
    medians = {side: statistics.median(r["ms_per_token"] for r in runs) for side, runs in results.items()}
    print(
        f"median ms/token: A {medians['A']:.1f}, B {medians['B']:.1f}; "
        f"B is {medians['A'] / medians['B']:.2f}x as fast"
    )
    if args.json:
        record = {"bench_options": bench_options, "b_settings": args.settings, **results}
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
