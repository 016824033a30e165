"""ScriptedMember: a fake of the right kind. It implements the Member protocol with scripted
candidates and scores, for the cases a tiny model cannot produce on demand (ties, exits)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specfuse.config import MemberSettings
from specfuse.members.protocol import BaseMember
from specfuse.records import Candidate


class ScriptedMember(BaseMember):
    def __init__(
        self,
        name: str,
        drafts: Sequence[str | tuple[str, bool]],
        judge: Callable[[str], float],
        draft_delay: float = 0.0,
    ):
        self.name = name
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
        return Candidate(self.name, text, max(1, len(text.split())), final, 0.0)

    def score(self, state: dict, candidates: Sequence[Candidate]) -> list[float]:
        self.calls.append(("score", state["round"]))
        return [self.judge(c.text) for c in candidates]

    def accept(self, state: dict, text: str) -> None:
        self.calls.append(("accept", text))
        state["answer"] += text
        state["round"] += 1
