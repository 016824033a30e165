"""One model behind two back ends: it drafts in one and scores in the other.

Why: on a CPU the two halves of a round want different kernels. Drafting decodes one token at a time,
reading every weight per token, so it is bound by memory reads: llama.cpp on the GGUF file's own
4-bit blocks reads a quarter of bf16's bytes and drafts 3–4× faster. Verification reads the weights
once for all candidates' tokens, so it is bound by arithmetic: torch's bf16 matrix products
(AVX-512 BF16 through oneDNN) do it faster than llama.cpp's 4-bit kernels. `--quantize gguf-draft`
pairs them: the same model, with drafts read from its 4-bit weights and every score computed in
bf16 (docs/benchmarks-log.md has the measurements).

Each half keeps its own context for a request. The drafter appends every winner at once; so does
the verifier after a round it verified (the winner's keys and values are already in its cache).
After a round it did not verify it waits: once the weak members have exited, most rounds have one
draft and no verify pass, and the bf16 model would otherwise re-read every segment the 4-bit one
drafted. The winners since its last verdict are read in one pass when it is next asked to score.

Name, trust and size are the verifier's. The benchmarks' floor and "member alone" figures describe
decoding, so they look through to the drafter (bench/floor.py, bench/measure.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import MemberSettings
from ..errors import ConfigError, SpecfuseError
from ..prompts import Prompt
from ..records import Candidate
from .protocol import BaseMember, Member, Verdict


@dataclass
class SplitState:
    """One request in both halves, and the winners the verifier has not read yet."""

    drafting: Any  # the drafter's state
    scoring: Any  # the verifier's state
    pending: list[str] = field(default_factory=list)
    scored: bool = False  # the verifier scored this round's candidates: the winner is in its cache


class SplitMember(BaseMember):
    """A member that drafts with `drafter` and scores with `verifier`, two loads of one model."""

    def __init__(self, drafter: Member, verifier: Member) -> None:
        if drafter.name != verifier.name:
            raise ConfigError(f"one model drafts and verifies: {drafter.name!r} is not {verifier.name!r}")
        self.drafter, self.verifier = drafter, verifier
        self.name = verifier.name
        self.device = verifier.device
        self.host = verifier.host
        self.trust = verifier.trust
        self.parameters = verifier.parameters
        self.dtype = f"drafts {getattr(drafter, 'dtype', '?')}, scores {getattr(verifier, 'dtype', '?')}"

    def __repr__(self) -> str:
        return f"SplitMember({self.drafter!r}, {self.verifier!r})"

    def sharing(self, name: str) -> SplitMember:
        """Both halves shared under `name`: the GGUF drafter and the torch verifier each say how."""
        return SplitMember(self.drafter.sharing(name), self.verifier.sharing(name))

    def start(self, prompt: Prompt, settings: MemberSettings) -> SplitState:
        return SplitState(
            self.drafter.start(prompt, _drafting(settings)), self.verifier.start(prompt, settings)
        )

    def start_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        """Both halves start every request; a request either half cannot start fails with its error."""
        return self._both("start_many", prompts, settings)

    def open_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        return self._both("open_many", prompts, settings)

    def prefill_many(self, states: Sequence[SplitState], budget: int) -> list[bool]:
        """Each half reads its next part (each its own budget: two back ends); read once both have."""
        drafts = self.drafter.prefill_many([s.drafting for s in states], budget)
        scores = self.verifier.prefill_many([s.scoring for s in states], budget)
        return [d and s for d, s in zip(drafts, scores, strict=True)]

    def _both(self, how: str, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        drafts = getattr(self.drafter, how)(prompts, [_drafting(s) for s in settings])
        scores = getattr(self.verifier, how)(prompts, settings)
        out: list[Any] = []
        for d, s in zip(drafts, scores, strict=True):
            failed = d if isinstance(d, SpecfuseError) else s if isinstance(s, SpecfuseError) else None
            out.append(failed or SplitState(d, s))
        return out

    def draft(self, state: SplitState, max_new_tokens: int) -> Candidate:
        return self.drafter.draft(state.drafting, max_new_tokens)

    def draft_many(self, states: Sequence[SplitState], budgets: Sequence[int]) -> list[Candidate]:
        return self.drafter.draft_many([s.drafting for s in states], budgets)

    def score(self, state: SplitState, candidates: Sequence[Candidate]) -> list[float]:
        return self.score_many([state], [candidates])[0][0]

    def score_many(
        self, states: Sequence[SplitState], candidates: Sequence[Sequence[Candidate]]
    ) -> list[Verdict]:
        for state in states:
            self._catch_up(state)
        verdicts = self.verifier.score_many([s.scoring for s in states], candidates)
        for state in states:
            state.scored = True
        return verdicts

    def accept(self, state: SplitState, text: str) -> None:
        self.drafter.accept(state.drafting, text)
        if state.scored:  # just verified: the verifier moves the winner's keys and values into place
            self.verifier.accept(state.scoring, text)
            state.scored = False
        else:
            state.pending.append(text)

    def prompt_surprise(self, state: SplitState) -> float | None:
        return self.verifier.prompt_surprise(state.scoring)

    def set_threads(self, threads: int) -> None:
        self.drafter.set_threads(threads)
        self.verifier.set_threads(threads)

    def _catch_up(self, state: SplitState) -> None:
        """The verifier reads the winners of the rounds it did not verify, in one pass."""
        if state.pending:
            self.verifier.accept(state.scoring, "".join(state.pending))
            state.pending = []


def _drafting(settings: MemberSettings) -> MemberSettings:
    """The drafter's settings: the prompt's surprise (prior="prompt") and every score are the
    verifier's, so the drafter keeps no values of its drafts."""
    return replace(settings, measure_prompt=False, own_draft_scores=False)


__all__ = ["SplitMember", "SplitState"]
