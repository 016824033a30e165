"""The gate's threshold chosen by evidence: accuracy, share of gated rounds and cost per answer and per
correct answer of each system of an evaluation (members alone, the ungated ensemble, gated variants),
each against the best member (paired, exact McNemar), with a plot of accuracy against cost.

    # 1. run the systems with specfuse.eval (gate variants are ordinary --variant settings):
    python -m specfuse.eval gsm8k --data ../shared/data/gsm8k/dev.jsonl --rows 0:300 --limit 40 \\
        --runs runs/gate --systems single-qwen2.5-coder-0.5b,probe,g10,g30 \\
        --variant probe:gate=true,gate_threshold=0 --variant g10:gate=true,gate_threshold=-0.1 ...
    # 2. this tool, on its report JSON or (GSM8K) its runs folder with the data file:
    python tools/gate_sweep.py results/eval/gsm8k.json --out results/eval/gsm8k-gate
    python tools/gate_sweep.py runs/gate --data ../shared/data/gsm8k/dev.jsonl --out /tmp/gate

`probe` above is the ungated ensemble measured: a gate that never passes (a mean log-probability of
0 is certainty) plays every round in full, exactly as gate=false does (tests/engine/test_gate.py), and its
rounds record the gatekeeper's confidence, so this tool also says how well each measure predicts
that the full round would have chosen the gatekeeper's segment anyway (the area under the ROC
curve), and what share of rounds each threshold would have gated.

Cost: member forward tokens, counted in the drafters' tokens: each token a member decoded into a
kept candidate (taken-over tokens excluded), each candidate token a verifier scored, and the winner's
tokens for each member that read it without having verified it, where a member not asked in gated
rounds reads their segments only when it is next asked (engine/batch.py). The seconds are the runs' own wall
time and the members' summed draft, verify and accept time: on a shared machine, noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfuse.config import GATE_MEASURES  # noqa: E402
from specfuse.errors import TraceError  # noqa: E402
from specfuse.eval.outcomes import load_outcomes  # noqa: E402
from specfuse.eval.problems import DataError, Outcome, parse_rows  # noqa: E402
from specfuse.eval.stats import paired, wilson  # noqa: E402
from specfuse.records import Round  # noqa: E402
from specfuse.trace import load_trace  # noqa: E402


def forward_tokens(rounds: Sequence[Round]) -> int:
    """A run's member forward tokens (the module's docstring). A member reads the answer only when it
    is asked (engine/batch.py): the sure segments of gated rounds are counted for a member when it
    next drafts or verifies, never if it is not asked again."""
    total, so_far, gone = 0, 0, set()
    read: dict[str, int] = {}  # each member's answer tokens read (in the winners' own tokens)
    for r in rounds:
        drafted = [c for c in r.candidates if c.member in r.active]
        for m in {c.member for c in drafted} | set(r.verifiers):  # catching up before it is asked
            total += so_far - read.get(m, 0)
            read[m] = so_far
        total += sum(max(0, c.num_tokens - c.reused_tokens) for c in drafted)
        total += len(r.verifiers) * sum(c.num_tokens for c in r.candidates)
        gone |= {e.member for e in r.exits}  # they leave before the accept
        gated = r.gate is not None and r.gate.passed
        readers = [] if gated or r.stop_reason else [m for m in r.members if m not in gone]
        for m in readers:  # the verifiers and the winner's drafter read it already
            total += 0 if m in r.verifiers or m == r.winner.member else r.winner.num_tokens
            read[m] = so_far + r.winner.num_tokens
        so_far += r.winner.num_tokens
        if gated:
            read[r.winner.member] = so_far
    return total


def member_seconds(rounds: Sequence[Round]) -> float:
    return sum(t.draft_s + t.verify_s + t.accept_s for r in rounds for t in r.timings)


def system_rows(outcomes: Sequence[Outcome], root: Path | None = None) -> list[dict[str, Any]]:
    """One row per system: accuracy (Wilson), gated share, cost per answer and per correct answer."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(o.system, []).append(o)
    rows: list[dict[str, Any]] = []
    for system, mine in by.items():
        tokens = seconds = members_s = 0.0
        rounds = gated = 0
        for o in mine:
            for path in o.traces:
                trace = _trace(path, root)
                if trace is None:
                    continue
                tokens += forward_tokens(trace.rounds)
                members_s += member_seconds(trace.rounds)
                seconds += trace.rounds[-1].elapsed if trace.rounds else 0.0
                rounds += len(trace.rounds)
                gated += sum(r.gated for r in trace.rounds)
        n, correct = len(mine), sum(o.correct for o in mine)
        low, high = wilson(correct, n)
        rows.append(
            {
                "system": system,
                "problems": n,
                "correct": correct,
                "accuracy": correct / n if n else 0.0,
                "ci_low": low,
                "ci_high": high,
                "gated_share": gated / rounds if rounds else 0.0,
                "rounds_per_answer": rounds / n if n else 0.0,
                "forward_tokens_per_answer": tokens / n if n else 0.0,
                "forward_tokens_per_correct": tokens / correct if correct else None,
                "seconds_per_answer": seconds / n if n else 0.0,
                "member_seconds_per_answer": members_s / n if n else 0.0,
                "member_seconds_per_correct": members_s / correct if correct else None,
            }
        )
    singles = [r for r in rows if r["system"].startswith("single-")]
    best = max(singles, key=lambda r: r["correct"], default=None)
    for r in rows:
        if best is None:
            continue
        theirs = {o.problem: o.correct for o in by[best["system"]]}
        shared = [o for o in by[r["system"]] if o.problem in theirs]
        stats = paired([o.correct for o in shared], [theirs[o.problem] for o in shared])
        r |= {
            "best_member": best["system"],
            "only_system": stats["only_a"],
            "only_best": stats["only_b"],
            "p_value": stats["p_value"],
            "token_ratio_to_best": r["forward_tokens_per_answer"] / best["forward_tokens_per_answer"]
            if best["forward_tokens_per_answer"]
            else None,
        }
    return rows


def _trace(path: str, root: Path | None) -> Any:
    for candidate in (Path(path), *((root / path, root.parent / path) if root is not None else ())):
        if candidate.is_file():
            try:
                return load_trace(candidate)
            except TraceError:
                return None
    return None


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """The area under the ROC curve: the chance a positive scores above a negative (ties: half)."""
    if not positives or not negatives:
        return None
    wins = sum((p > q) + 0.5 * (p == q) for p in positives for q in negatives)
    return wins / (len(positives) * len(negatives))


def calibration(outcomes: Sequence[Outcome], system: str, root: Path | None) -> dict[str, Any] | None:
    """From a system whose every round ran in full under the gate (the probe): per measure, the AUC
    for "the full round chose the gatekeeper's segment", and the share of rounds each threshold of
    a grid would have gated (and of those, the share where the full round agreed)."""
    samples: list[tuple[Any, bool]] = []
    for o in outcomes:
        if o.system != system:
            continue
        for path in o.traces:
            trace = _trace(path, root)
            for r in trace.rounds if trace is not None else ():
                if r.gate is None or r.gate.passed or len(r.candidates) < 2:
                    continue
                keeper = next((c for c in r.candidates if c.member == r.gate.member), None)
                if keeper is None or keeper.confidence is None:
                    continue
                samples.append((keeper.confidence, r.winner.member == r.gate.member))
    if not samples:
        return None
    out: dict[str, Any] = {"system": system, "rounds": len(samples), "agreed": sum(a for _, a in samples)}
    grids = {
        "mean_logprob": [-0.01, -0.02, -0.05, -0.1, -0.2, -0.3, -0.5, -1.0],
        "min_prob": [0.9, 0.8, 0.7, 0.5, 0.3, 0.1],
        "margin": [5.0, 3.0, 2.0, 1.0, 0.5, 0.1],
    }
    for measure in GATE_MEASURES:
        values = [(c.measure(measure), agreed) for c, agreed in samples]
        out[measure] = {
            "auc": auc([v for v, a in values if a], [v for v, a in values if not a]),
            "thresholds": [
                {
                    "threshold": t,
                    "would_gate": sum(v >= t for v, _ in values) / len(values),
                    "agreed_when_gated": (
                        sum(a for v, a in values if v >= t) / max(1, sum(v >= t for v, _ in values))
                    ),
                }
                for t in grids[measure]
            ],
        }
    return out


def plot(rows: Sequence[dict[str, Any]], out: Path, title: str, png: bool = False) -> Path:
    """OUT.html, and with `png` OUT.png too (kaleido and a Chrome: BROWSER_PATH=/usr/bin/chromium)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    most = max((r["problems"] for r in rows), default=0)
    for r in rows:
        kind = "member" if r["system"].startswith("single-") else "ensemble"
        label = f"{r['system']} ({r['gated_share']:.0%} gated)" if r["gated_share"] else r["system"]
        label += f", {r['problems']} problems" if r["problems"] != most else ""  # a wider interval
        figure.add_trace(
            go.Scatter(
                x=[r["forward_tokens_per_answer"]],
                y=[r["accuracy"]],
                error_y={"type": "data", "symmetric": False, "array": [r["ci_high"] - r["accuracy"]],
                         "arrayminus": [r["accuracy"] - r["ci_low"]]},
                mode="markers",  # named in the legend: labels beside points overlap where systems cost alike
                marker={"symbol": "circle" if kind == "member" else "diamond", "size": 12},
                name=label,
            )
        )  # fmt: skip
    figure.update_layout(
        title=f"{title}: accuracy against cost ({most} problems, 95 % Wilson intervals)",
        xaxis={"title": "member forward tokens per answer"},
        yaxis={"title": "accuracy"},
        width=900,
        height=560,
    )
    path = out.with_name(out.name + ".html")
    figure.write_html(path, include_plotlyjs="cdn")
    if png:
        figure.write_image(out.with_name(out.name + ".png"), scale=1)
    return path


def table(rows: Sequence[dict[str, Any]]) -> str:
    keys = ["system", "problems", "correct", "accuracy", "ci_low", "ci_high", "gated_share",
            "forward_tokens_per_answer", "forward_tokens_per_correct", "token_ratio_to_best",
            "member_seconds_per_answer", "only_system", "only_best", "p_value"]  # fmt: skip

    def cell(v: Any) -> str:
        return "–" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def _rows(text: str) -> range:
    try:
        return parse_rows(text)
    except DataError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a specfuse.eval report JSON, or a --runs folder (GSM8K)")
    parser.add_argument("--data", type=Path, default=None, help="the GSM8K JSONL, with a runs folder")
    parser.add_argument("--probe", default="probe", help="the ungated system measured under the gate")
    parser.add_argument("--out", type=Path, required=True, help="stem of the JSON and HTML written")
    parser.add_argument("--title", default="gate sweep")
    parser.add_argument("--png", action="store_true", help="also OUT.png (kaleido, and Chrome: BROWSER_PATH)")
    parser.add_argument("--rows", type=_rows, default=None, help="only these rows, FIRST:END (0-based)")
    args = parser.parse_args(argv)
    outcomes = load_outcomes(args.source, args.data)
    if args.rows is not None:  # a problem's id ends in its row: gsm8k-0042, ifeval-0042
        outcomes = [o for o in outcomes if int(o.problem.rsplit("-", 1)[-1]) in args.rows]
    root = args.source.parent if args.source.is_file() else args.source
    rows = system_rows(outcomes, root)
    found = calibration(outcomes, args.probe, root)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    html = plot(rows, args.out, args.title, args.png)
    document = {"systems": rows, "calibration": found, "source": str(args.source)}
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(document, indent=1) + "\n")
    print(table(rows))
    if found:
        print(f"\nprobe {found['system']}: {found['rounds']} contested rounds, the gatekeeper's segment won "
              f"{found['agreed']}")  # fmt: skip
        for measure in GATE_MEASURES:
            auc_value = found[measure]["auc"]
            shown = "–" if auc_value is None else f"{auc_value:.3f}"
            grid = ", ".join(
                f"{t['threshold']:g}: {t['would_gate']:.0%} ({t['agreed_when_gated']:.0%} agreed)"
                for t in found[measure]["thresholds"]
            )
            print(f"  {measure}: AUC {shown}; would gate at {grid}")
    print(f"\nwrote {html} and {args.out.with_name(args.out.name + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
