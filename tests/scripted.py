"""ScriptedMember: a fake of the right kind. It implements the Member protocol with scripted
candidates and scores, for the cases a tiny model cannot produce on demand (ties, exits). Also the
judges, slow members and traces the app and browser tests build from it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specfuse import Ensemble, EnsembleConfig, Trace, save_trace
from specfuse.config import MemberSettings
from specfuse.members.protocol import BaseMember
from specfuse.records import Candidate, Confidence


class ScriptedMember(BaseMember):
    def __init__(
        self,
        name: str,
        drafts: Sequence[str | tuple[str, bool]],
        judge: Callable[[str], float],
        draft_delay: float = 0.0,
        sure: Callable[[str], float] | None = None,
    ):
        self.name = name
        self.sure = sure  # text → its confidence in that draft (every measure alike); None: it gives none
        self.draft_delay = draft_delay  # seconds each draft takes (a slow member, for arrival order)
        self.device = "cpu"
        self.drafts = [d if isinstance(d, tuple) else (d, False) for d in drafts]
        self.judge = judge  # text → raw score this member gives it
        self.calls: list[tuple[str, object]] = []

    def start(self, prompt: str, settings: MemberSettings) -> dict:
        self.calls.append(("start", prompt))
        return {"round": 0, "answer": ""}

    def draft(self, state: dict, max_new_tokens: int) -> Candidate:
        text, final = self.drafts[min(state["round"], len(self.drafts) - 1)]
        self.calls.append(("draft", state["round"]))
        time.sleep(self.draft_delay)
        value = None if self.sure is None else self.sure(text)
        confidence = None if value is None else Confidence(value, value, value, 1)
        return Candidate(self.name, text, max(1, len(text.split())), final, 0.0, confidence=confidence)

    def score(self, state: dict, candidates: Sequence[Candidate]) -> list[float]:
        self.calls.append(("score", state["round"]))
        return [self.judge(c.text) for c in candidates]

    def accept(self, state: dict, text: str) -> None:
        self.calls.append(("accept", text))
        state["answer"] += text
        state["round"] += 1


def prefers(favourite: str):
    return lambda text: 3.0 if text == favourite else 1.0


def looping(**options) -> dict[str, ScriptedMember]:
    """loop-a and loop-b, drafting "a " and "b " 2,000 times: their runs last until they are stopped
    (`options` go to ScriptedMember: draft_delay)."""
    return {f"loop-{c}": ScriptedMember(f"loop-{c}", [f"{c} "] * 2000, len, **options) for c in "ab"}


def scripted_rounds(max_rounds: int = 6, **config):
    """Three scripted members: b always wins, c always loses (and exits once allowed)."""
    members = [
        ScriptedMember("a", ["fine "] * 50, prefers("good ")),
        ScriptedMember("b", ["good "] * 50, prefers("good ")),
        ScriptedMember("c", ["junk "] * 50, prefers("good ")),
    ]
    cfg = EnsembleConfig(max_rounds=max_rounds, exit_warmup=2, **config)
    return Trace("go", ("a", "b", "c"), cfg, tuple(Ensemble(members, cfg).stream("go")))


class SlowMember(ScriptedMember):
    """Round 1 is quick; later drafts take 2.5 s: a round is in flight when Stop is pressed, as with
    real models (and the next run's first round comes quickly)."""

    def draft(self, state, max_new_tokens):
        time.sleep(2.5 if state["round"] else 0.1)
        return super().draft(state, max_new_tokens)


def scripted_trace(path: Path, drafts: dict[str, list[str]], rounds: int = 6) -> Trace:
    """A trace of scripted members (their names and texts as given), saved at `path` for upload."""
    favourite = next(iter(drafts))
    members = [
        ScriptedMember(name, texts, lambda t, f=drafts[favourite]: 2.0 if t in f else 1.0)
        for name, texts in drafts.items()
    ]
    # verify="always": every round has a matrix to show, lone drafts too (the default leaves those
    # unscored, and after the early exits here the last rounds are lone)
    config = EnsembleConfig(max_rounds=rounds, exit_warmup=1, verify="always")
    trace = Trace("go", tuple(drafts), config, tuple(Ensemble(members, config).stream("go")))
    save_trace(trace, path)
    return trace
