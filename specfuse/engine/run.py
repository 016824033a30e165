"""One prompt's run in progress: its state from round to round, and its own part of each step.

batch.Batch plays runs in lockstep: it asks the members (draft, verify, accept) once for all the
runs they serve, and each run does the rest on its own (choose, feedback, stop, exit, record), in
the order batch.py's docstring gives. Everything here belongs to one request, never to a member:
the weights, qualities, exits, the answer so far and each member's state for this request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import feedback
from ..config import EnsembleConfig
from ..errors import ConfigError, MemberError
from ..members.protocol import Verdict
from ..prompts import Prompt, as_prompt, last_user_text
from ..records import ECHO, Candidate, ExitEvent, Gate, MemberTiming, Round, TokenScores
from ..segments import agreement, echoes_prompt, ends_in_loop, repeated_fraction, stop_string_cut
from ..trace import new_trace_id
from . import gate
from .calls import MemberCalls, without_prompt

TYPED = "you"  # the origin of a segment a person typed into a branch
LOOP_GUARD_COPIES = 2  # the loop guard acts once a block repeats twice, before a loop sets in


@dataclass
class Play:
    """The round being played by one run: made afresh each round, turned into a Round by record()."""

    began: float
    drafting: list[str]  # A_k
    verifiers: list[str]
    budget: int  # tokens each drafter may add this round
    gatekeeper: str | None = None  # config.gate: the member that drafts first this round
    waiting: list[str] = field(default_factory=list)  # drafters held back until the gate has decided
    gate: Gate | None = None  # the gate's decision, once the gatekeeper has drafted
    candidates: tuple[Candidate, ...] = ()
    scorable: bool = False  # some candidate has text (or ends the answer)
    agreed: int | None = None  # verify="contested"/"disagree": the draft taken unscored (lone, or agreed on)
    raw: list[list[float]] = field(default_factory=list)  # [verifiers][candidates]: z_ij
    details: tuple[tuple[TokenScores, ...], ...] = ()
    draft_s: dict[str, float] = field(default_factory=dict)
    verify_s: dict[str, float] = field(default_factory=dict)
    scores: list[list[float]] = field(default_factory=list)  # normalized ŝ_ij
    y: list[float] = field(default_factory=list)  # aggregate per candidate
    eligible: list[bool] = field(default_factory=list)
    chosen: int = 0
    margin: float = 0.0
    rewards: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)  # weights after feedback
    stop_reason: str | None = None
    exits: list[ExitEvent] = field(default_factory=list)
    accepting: list[str] = field(default_factory=list)
    catch_up_s: dict[str, float] = field(default_factory=dict)  # reading what it missed (Batch._catch_up)


@dataclass
class Run:
    """One prompt's run in progress: everything that belongs to one request (never to a member)."""

    prompt: Prompt  # a conversation, or a string (one user message); a list of messages is checked
    config: EnsembleConfig
    names: tuple[str, ...]
    start: Sequence[Round] = ()
    forced: str | None = None
    origin: str = TYPED
    id: str = field(default_factory=new_trace_id)  # the key of its results in a batch; its trace's id
    states: dict[str, Any] = field(default_factory=dict)  # each member's state for this request
    read: dict[str, int] = field(default_factory=dict)  # how much of the answer each member's state holds
    # Set by resume(), then carried from round to round.
    k: int = 0
    weights: list[float] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)  # Q_i: cumulative aggregate scores
    active: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)
    answer: str = ""
    tokens: int = 0
    began: float = 0.0
    done: bool = False
    cancelled: bool = False  # set from any thread: the run leaves its batch at the next phase
    # Step mode (the Scheduler's submit(step=True)): the run leaves its batch after each round, its
    # states dropped, and comes back as a new Run resumed from its rounds (`start`).
    pause: bool = False
    played_s: float = 0.0  # seconds played before it (re)joined: its clock stops while it is paused
    play: Play = field(default_factory=lambda: Play(0.0, [], [], 0))
    # The API's log-probabilities: None, not asked; else how many alternatives each verifier gives
    # per token (0: the chosen tokens' only). A round taken unscored (a lone draft, drafts that
    # agreed, a gated round) is then scored after its choice by its own drafters, the members that
    # took it, so that every token of the answer has a score; the choice, weights and exits are
    # those of the same run without it.
    logprobs: int | None = None
    # The API's echo: the prompt (a string) is not answered but scored, in one round, by every
    # member from its plain-text context (MemberSettings.raw): the verification pass alone.
    echo: bool = False

    def __post_init__(self) -> None:
        self.prompt = as_prompt(self.prompt)  # a list of messages (dicts) as a checked Conversation

    def resume(self, calls: MemberCalls) -> None:
        """Set the run's starting point: round 1, or the round after a branch's `start` rounds."""
        n = len(self.names)
        given = self.config.initial_weights
        if given and len(given) != n:
            raise ConfigError(
                f"initial_weights has {len(given)} values for {n} members ({', '.join(self.names)})"
            )
        if given:
            self.weights = [w / sum(given) for w in given]
        elif self.config.prior == "prompt":
            surprise = [calls.surprise(m, self) for m in self.names]
            self.weights = feedback.prior_weights(surprise, self.config.prior_temperature)
        elif self.config.prior == "trust":
            self.weights = feedback.trust_weights([calls.trust(m) for m in self.names])
        else:
            self.weights = feedback.uniform(n)
        self.quality = dict.fromkeys(self.names, 0.0)
        self.active = list(self.names)
        self.read = dict.fromkeys(self.names, 0)
        if not self.start:
            return
        for rnd in self.start:
            for j, c in enumerate(rnd.candidates):
                if c.member in self.quality:
                    self.quality[c.member] += rnd.aggregate[j]
            for e in rnd.exits:
                self.active.remove(e.member)
                self.exited.append(e.member)
        last = self.start[-1]
        self.weights = list(last.weights_after)
        self.answer = last.text
        self.tokens = sum(r.winner.num_tokens for r in self.start)
        self.k = last.k
        playing = [*self.active, *(self.exited if self.config.exited_verify else [])]
        calls.accept([(m, self, self.answer) for m in self.names if m in playing])
        self.read.update(dict.fromkeys(playing, len(self.answer)))

    def begin_round(self) -> None:
        self.k += 1
        cfg = self.config
        verifiers = [m for m in self.names if m in self.active or (cfg.exited_verify and m in self.exited)]
        budget = min(cfg.segment_len, cfg.max_new_tokens - self.tokens)
        self.play = play = Play(time.perf_counter(), list(self.active), verifiers, budget)
        if self.echo:  # nobody drafts: the given text is the round's one candidate
            play.drafting = []
            play.verifiers = list(self.names)
        elif cfg.loop_guard and self.exited and ends_in_loop(self.answer, copies=LOOP_GUARD_COPIES):
            # A lone drafter stuck in a loop has no way out; the ensemble has: the others' drafts.
            play.drafting = [m for m in self.names if m in self.active or m in self.exited]
            play.verifiers = list(play.drafting)
        elif cfg.gate and self.forced is None and len(play.drafting) > 1:
            # The gatekeeper drafts first; the others wait for the gate (take_gate). A branch's forced
            # round and a loop guard's rejoining round are full rounds: there the others are wanted.
            play.gatekeeper = gate.gatekeeper(self.names, self.weights, play.drafting, cfg.gate_member)
            play.waiting = [m for m in play.drafting if m != play.gatekeeper]

    def drafting_now(self) -> list[str]:
        """Who drafts in the draft phase under way: all drafters, or, under the gate, first the
        gatekeeper and then (take_gate) the others if it was unsure."""
        return [m for m in self.play.drafting if m not in self.play.waiting]

    def take_gate(self, drafted: dict[tuple[str, str], tuple[Candidate, float]]) -> list[str]:
        """After the gatekeeper's draft: decide the gate. Passed, the round is the gatekeeper's alone;
        else the others draft now (their names are returned) and the full round runs with its draft
        (never redrafted)."""
        play, cfg = self.play, self.config
        if play.gatekeeper is None or play.gate is not None:
            return []
        keeper = play.gatekeeper
        found = drafted[(keeper, self.id)][0].confidence
        play.gate = gate.decide(keeper, found, cfg.gate_measure, cfg.gate_bar)
        others, play.waiting = play.waiting, []
        if play.gate.passed:
            play.drafting = [keeper]
            return []
        return others

    def take_candidates(self, drafted: dict[tuple[str, str], tuple[Candidate, float]]) -> None:
        play = self.play
        if self.echo:  # final: each verifier also scores its end marker, so the text's last position
            # (what would follow it) is scored too
            assert isinstance(self.prompt, str)
            play.candidates = (Candidate(ECHO, self.prompt, count_tokens(self.prompt), True, 0.0),)
            play.scorable = True
            return
        candidates = [drafted[(m, self.id)][0] for m in play.drafting]
        play.draft_s = {c.member: c.seconds for c in candidates}
        if self.forced is not None and not any(c.text == self.forced for c in candidates):
            # A typed segment joins the round as one more candidate, scored by every verifier.
            candidates.append(Candidate(self.origin, self.forced, count_tokens(self.forced), False, 0.0))
        play.candidates = tuple(candidates)
        play.scorable = any(c.text or c.final for c in play.candidates)
        mode = self.config.verify
        if play.gate is not None and play.gate.passed:  # a gated round: the sure segment, unscored
            play.agreed, play.verifiers = 0, []
        elif mode != "always" and self.forced is None:
            if len(candidates) == 1:  # a lone draft wins anyway
                play.agreed = 0
            elif mode == "disagree":
                play.agreed = agreement([(c.text, c.final) for c in candidates])
            if play.agreed is not None:
                play.verifiers = []  # nothing to decide: no verify pass
        if play.agreed is not None and self.logprobs is not None:
            play.verifiers = list(play.drafting)  # scored for the log-probabilities only (see logprobs)

    def take_scores(self, verdicts: dict[tuple[str, str], tuple[Verdict, float]]) -> None:
        play = self.play
        if play.scorable:
            rows = [verdicts[(m, self.id)][0] for m in play.verifiers]
            play.raw = [list(z) for z, _ in rows]
            for m, row in zip(play.verifiers, play.raw):
                _check_finite(m, row, play.candidates)
            play.details = tuple(d for _, d in rows) if all(d for _, d in rows) else ()
            play.verify_s = {m: verdicts[(m, self.id)][1] for m in play.verifiers}
        else:  # every draft came back empty: nothing to choose from
            play.raw = [[0.0] * len(play.candidates) for _ in play.verifiers]

    def choose(self) -> None:
        """3. Choose: normalize each verifier's row, aggregate with the weights learned so far, pick."""
        cfg, play = self.config, self.play
        candidates = play.candidates
        if play.agreed is not None or self.echo:
            play.y, play.eligible = [0.0] * len(candidates), [True] * len(candidates)
            play.chosen, play.margin = play.agreed or 0, 0.0
            if play.raw:  # scored for the log-probabilities only: kept, never chosen by
                play.scores = feedback.normalize(play.raw, cfg.normalization)
            return
        raw = (
            feedback.contrast(play.raw, play.verifiers, [c.member for c in candidates])
            if cfg.contrastive
            else play.raw
        )
        play.scores = feedback.normalize(raw, cfg.normalization)
        y = feedback.aggregate(
            play.scores,
            self._voting(),
            play.verifiers,
            [c.member for c in candidates],
            cfg.self_scores,
            cfg.aggregation,
            cfg.outlier_gap,
        )
        if cfg.repeat_penalty:
            repeated = [repeated_fraction(self.answer, c.text) for c in candidates]
            y = feedback.penalize_repeats(y, repeated, cfg.repeat_penalty)
        play.y = y
        # An empty non-final draft never wins; nor, with the echo guard, a candidate that would
        # leave the answer a verbatim piece of the question, the last user turn (unless every
        # candidate would).
        eligible = [bool(c.text or c.final) for c in candidates]
        if cfg.echo_guard:
            fresh = [
                ok and not echoes_prompt(last_user_text(self.prompt), self.answer, c.text)
                for ok, c in zip(eligible, candidates)
            ]
            eligible = fresh if any(fresh) else eligible
        if cfg.loop_guard:  # a candidate that ends the answer stops a loop rather than extending it
            unlooped = [
                ok and (c.final or not ends_in_loop(self.answer + c.text, copies=LOOP_GUARD_COPIES))
                for ok, c in zip(eligible, candidates)
            ]
            eligible = unlooped if any(unlooped) else eligible
        play.eligible = eligible
        pool = [j for j, ok in enumerate(eligible) if ok] or list(range(len(candidates)))
        if self.forced is not None:  # a branch: this round's winner is given
            chosen = next(j for j, c in enumerate(candidates) if c.text == self.forced)
            others = [y[j] for j in range(len(y)) if j != chosen]
            play.chosen, play.margin = chosen, (y[chosen] - max(others)) if others else 0.0
        else:
            play.chosen, play.margin = feedback.choose(y, pool)

    def feedback(self) -> None:
        """4. Feedback *after* the choice, so round k is judged with weights from rounds < k.
        SpecEM: the reference updated the weights before using them in the same round."""
        cfg, play = self.config, self.play
        drafted = len(play.drafting)  # a typed candidate (last) earns no reward
        play.rewards = [0.0] * len(play.candidates)
        play.after = self.weights
        if not cfg.feedback or play.agreed is not None or self.echo:  # no evidence: unscored, or no drafts
            return
        drafted_scores = [row[:drafted] for row in play.scores]
        judges = self._voting() if cfg.weighted_rewards else None
        play.rewards[:drafted] = feedback.rewards(drafted_scores, play.verifiers, play.drafting, judges)
        if drafted > 1:
            eta = feedback.learning_rate(cfg.learning_rate, len(self.names), self.k)
            play.after = feedback.update_weights(
                self.weights, self.names, play.drafting, play.rewards[:drafted], eta
            )

    def stop(self) -> None:
        """5. Stop: append the winner to the answer and decide whether the run ends here."""
        cfg, play = self.config, self.play
        winner = play.candidates[play.chosen]
        if self.echo:  # the given text, whole, whatever it holds; it is no answer: no budget spent
            self.answer, play.stop_reason = winner.text, "budget"
            return
        stop_reason: str | None = None
        cut = stop_string_cut(self.answer, winner.text, cfg.stop_strings)
        if cut is not None:
            winner = replace(winner, text=winner.text[:cut], final=True)
            play.candidates = play.candidates[: play.chosen] + (winner,) + play.candidates[play.chosen + 1 :]
            stop_reason = "stop"
        self.answer += winner.text
        self.tokens += winner.num_tokens
        if not play.scorable:
            stop_reason = "empty"
        elif stop_reason is None and winner.final:
            stop_reason = "final"
        elif stop_reason is None and self.tokens >= cfg.max_new_tokens:
            stop_reason = "budget"
        elif stop_reason is None and cfg.max_rounds is not None and self.k >= cfg.max_rounds:
            stop_reason = "rounds"
        play.stop_reason = stop_reason

    def exit(self) -> None:
        """6. Exit: members whose candidates keep losing stop drafting; then who accepts the winner."""
        cfg, play = self.config, self.play
        for j, m in enumerate(play.drafting):
            self.quality[m] += play.y[j]
        play.exits = []
        if play.stop_reason is not None:
            return  # the run ends: nobody exits, nobody needs the winner in its context
        gated = play.gate is not None and play.gate.passed  # the others were not asked: no evidence
        if cfg.exit and not gated:
            for d in feedback.exit_decisions(
                self.quality,
                self.active,
                self.k,
                cfg.exit_threshold,
                cfg.exit_warmup,
                cfg.exit_temperature,
                cfg.exit_min_active,
            ):
                play.exits.append(
                    ExitEvent(
                        member=d.member,
                        k=self.k,
                        keep_probability=d.keep_probability,
                        threshold=d.threshold,
                        reason=f"keep-probability {d.keep_probability:.3f} < δ/|A| = {d.threshold:.3f} "
                        f"after {self.k} rounds (cumulative quality {self.quality[d.member]:.3f})",
                    )
                )
        if gated:  # the others read its sure segment when next asked (Batch._catch_up), if ever
            play.accepting = list(play.drafting)
            return
        leaving = {e.member for e in play.exits}
        playing = [m for m in self.active if m not in leaving]
        judging = [*self.exited, *leaving] if cfg.exited_verify else []
        play.accepting = [m for m in self.names if m in playing or m in judging]

    def _voting(self) -> list[float]:
        """The verifiers' weights this round (the weights learned in rounds < k)."""
        index = {m: i for i, m in enumerate(self.names)}
        return [self.weights[index[v]] for v in self.play.verifiers]

    @property
    def winner_text(self) -> str:
        return self.play.candidates[self.play.chosen].text

    def record(self, accepted: dict[tuple[str, str], tuple[None, float]]) -> Round:
        """The round as a plain record; then the run moves on (or ends)."""
        play = self.play
        accept_s = {m: accepted[(m, self.id)][1] for m in play.accepting}
        self.read.update(dict.fromkeys(play.accepting, len(self.answer)))
        now = time.perf_counter()
        rnd = Round(
            k=self.k,
            members=self.names,
            active=tuple(play.drafting),
            verifiers=tuple(play.verifiers),
            candidates=play.candidates,
            raw_scores=_freeze(play.raw),
            scores=_freeze(play.scores),
            aggregate=tuple(play.y),
            chosen=play.chosen,
            margin=play.margin,
            weights_before=tuple(self.weights),
            weights_after=tuple(play.after),
            rewards=tuple(play.rewards),
            exits=tuple(play.exits),
            timings=tuple(
                MemberTiming(
                    m,
                    play.draft_s.get(m, 0.0),
                    play.verify_s.get(m, 0.0),
                    accept_s.get(m, 0.0) + play.catch_up_s.get(m, 0.0),
                )
                for m in self.names
            ),
            seconds=now - play.began,
            elapsed=now - self.began,
            text=self.answer,
            stop_reason=play.stop_reason,
            eligible=tuple(play.eligible),
            token_scores=play.details,
            verified=play.agreed is None,
            gate=play.gate,
        )
        self.forced = None  # only the branch round is forced
        self.weights = play.after
        for e in play.exits:
            self.active.remove(e.member)
            self.exited.append(e.member)
            if not (self.config.exited_verify or self.config.loop_guard):  # gone for good: its caches too
                for key in (e.member, without_prompt(e.member)):
                    self.states.pop(key, None)
        self.done = play.stop_reason is not None
        return rnd


def count_tokens(text: str) -> int:
    """A typed segment's length for the budget: its words and marks (it has no drafter tokenizer)."""
    return max(1, len(text.split()))


def _check_finite(member: str, row: Sequence[float], candidates: Sequence[Candidate]) -> None:
    """A verifier whose raw scores hold nan or ±inf (damaged weights, a broken server) ends the
    request with its name: normalizing them would fail with a bare ValueError, or choose at random."""
    bad = [(v, c.member) for v, c in zip(row, candidates) if not math.isfinite(v)]
    if bad:
        value, of = bad[0]
        raise MemberError(
            f"{member}: its scores are not finite ({value}, for the candidate of {of}; {len(bad)} of "
            f"{len(row)}); its weights or its server's answers are damaged (a model file that changed "
            "on disk?), so this request ends"
        )


def _freeze(matrix: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in matrix)
