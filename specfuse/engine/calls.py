"""The members' part of one step of a round (MemberCalls): one call per member for all the runs it
serves (members batch them), timed, a failure named with the member and the step; members at the
same time on their own threads (members/workers.py) when the engine asks for it.

Results are keyed by (member name, run id): a run's id is its trace id, unique for the process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from .. import feedback
from ..config import EnsembleConfig, MemberSettings
from ..errors import MemberError, SpecfuseError
from ..members import profiling
from ..members.protocol import Member, Verdict
from ..members.workers import MemberWorkers
from ..prompts import Prompt
from ..records import Candidate

T = TypeVar("T")


class Request(Protocol):
    """What MemberCalls needs of one request in progress (the engine's run)."""

    id: str  # unique among the runs under way
    prompt: Prompt  # a conversation, or a string (one user message)
    config: EnsembleConfig
    names: tuple[str, ...]  # the request's own members, in its order (a subset of those loaded)
    states: dict[str, Any]  # each member's state for this request
    logprobs: int | None  # the API's log-probabilities: None, or the alternatives per token
    echo: bool  # the API's echo: the prompt scored from a plain-text context


# prompt_contrast: each member's second context, the same answer after this prompt instead of the
# user's (nothing asked), kept in the run's states under a key no member name can take (the
# Ensemble refuses names that are not printable).
PROMPT_LEFT_OUT = ""


def without_prompt(m: str) -> str:
    return f"{m}\x00without the prompt"


def asked(run: Request, settings: MemberSettings) -> MemberSettings:
    """A member's settings for this run, with what its API request asked beyond the run settings:
    the alternatives per scored token (logprobs) and the plain-text context (echo)."""
    if run.logprobs is None and not run.echo:
        return settings
    return dataclasses.replace(settings, logprobs=True, top_logprobs=run.logprobs or 0, raw=run.echo)


Work = tuple[str, "Request", Any]  # (member name, run, the step's argument for that run)
Done = tuple[tuple[str, str], tuple[T, float]]  # ((member name, run id), (result, seconds))


class MemberCalls:
    """The members' part of a step, over every run that needs it: one call per member for all the
    runs it serves (members batch them), members at the same time (workers.py) when asked to,
    timed, and a failure re-raised with the member's name and the step.

    With `isolate`, a failure is not raised: it is kept in `failures` (by the id of each run the
    failed call served) and the step goes on for the other members, so that the caller can end only the
    runs that needed the failed member."""

    def __init__(self, members: Sequence[Member], concurrent: bool, *, isolate: bool = False) -> None:
        self.members = {m.name: m for m in members}
        self.workers = MemberWorkers(members) if concurrent else None
        self.isolate = isolate
        self.failures: dict[str, SpecfuseError] = {}  # run id -> why it cannot go on (isolate)

    def start(self, runs: Sequence[Request], *, read: bool = True) -> None:
        """Each run's own members start it (`read` False: open it, its prompt checked but not read,
        for prefill() to read in parts), each member once for all the runs it serves (start_many:
        an HFMember reads their prompts together); member i of the run's own list gets
        member_settings(i), so that a run of a subset equals an ensemble of that subset. One run's
        bad prompt (too long for a member's context) fails that run, not the others starting beside
        it; a start_many that raises fails every run it served. A run with prompt_contrast also
        starts each member with the prompt left out (its state under without_prompt(m))."""

        def begin(m: str, group: list[Request], left_out: list[bool]) -> list[tuple[bool, Any]]:
            settings = [asked(r, r.config.member_settings(r.names.index(m))) for r in group]
            prompts = [PROMPT_LEFT_OUT if out else r.prompt for r, out in zip(group, left_out)]
            member = self.members[m]
            return list(zip(left_out, (member.start_many if read else member.open_many)(prompts, settings)))

        work = [(m, r, False) for r in runs for m in r.names]
        work += [(m, r, True) for r in runs if r.config.prompt_contrast for m in r.names]
        for (m, key), ((left_out, state), _) in self._by_member("start", work, begin):
            run = next(r for r in runs if r.id == key)
            if left_out and isinstance(state, SpecfuseError):  # say why a prompt nobody typed was read
                state = type(state)(
                    f"prompt_contrast: {m} cannot start a context without the prompt: {state}"
                )
            if not isinstance(state, SpecfuseError):
                run.states[without_prompt(m) if left_out else m] = state
            elif self.isolate:
                self.failures.setdefault(key, state)
            else:
                raise state

    def prefill(self, work: Sequence[Work]) -> dict[tuple[str, str], tuple[bool, float]]:
        """Each member reads its next part of the runs' prompts (their opened states, in the order
        given), at most the work's budget (the same for all of a member's runs) in all; whether each
        run's prompt is now read whole by that member (both its contexts with prompt_contrast)."""

        def prefill(m: str, group: list[Request], budgets: list[int]) -> list[bool]:
            contrasted = [i for i, r in enumerate(group) if r.config.prompt_contrast]
            states = [r.states[m] for r in group] + [group[i].states[without_prompt(m)] for i in contrasted]
            done = self.members[m].prefill_many(states, budgets[0])
            out = done[: len(group)]
            for i, other in zip(contrasted, done[len(group) :]):
                out[i] = out[i] and other
            return out

        return dict(self._by_member("prefill", work, prefill))

    def surprise(self, m: str, run: Request) -> float | None:
        """The member's surprise at the prompt (nats per byte), when it can tell (prior weights)."""
        return self.members[m].prompt_surprise(run.states[m])

    def trust(self, m: str) -> float | None:
        return self.members[m].trust

    def draft(self, work: Sequence[Work]) -> Iterator[Done[Candidate]]:
        """Each member's candidates, yielded as each member finishes (the fastest first)."""

        def draft(m: str, group: list[Request], budgets: list[int]) -> list[Candidate]:
            return self.members[m].draft_many([r.states[m] for r in group], budgets)

        return self._by_member("draft", work, draft)

    def verify(self, work: Sequence[Work]) -> dict[tuple[str, str], tuple[Verdict, float]]:
        """Each verifier's raw scores z_i· (and token evidence, from members that keep it)."""

        def verify(m: str, group: list[Request], candidates: list[Sequence[Candidate]]) -> list[Verdict]:
            # Runs with prompt_contrast score their candidates a second time with the prompt left
            # out, in the same call (a member batches both).
            contrasted = [i for i, r in enumerate(group) if r.config.prompt_contrast]
            states = [r.states[m] for r in group] + [group[i].states[without_prompt(m)] for i in contrasted]
            verdicts = self.members[m].score_many(states, [*candidates, *(candidates[i] for i in contrasted)])
            out = verdicts[: len(group)]
            for i, (z_without, _) in zip(contrasted, verdicts[len(group) :]):
                z, evidence = out[i]
                out[i] = (feedback.prompt_contrast(z, z_without, group[i].config.prompt_contrast), evidence)
            return out

        return dict(self._by_member("score", work, verify))

    def accept(self, work: Sequence[Work]) -> dict[tuple[str, str], tuple[None, float]]:
        """Each member appends the text to each request's context; the seconds it took."""

        def accept(m: str, group: list[Request], texts: list[str]) -> list[None]:
            member = self.members[m]
            for r, t in zip(group, texts):
                member.accept(r.states[m], t)
                if r.config.prompt_contrast:
                    member.accept(r.states[without_prompt(m)], t)
            return [None] * len(group)

        return dict(self._by_member("accept", work, accept))

    def _by_member(
        self, step: str, work: Sequence[Work], call: Callable[[str, list[Request], list[Any]], list[T]]
    ) -> Iterator[Done[T]]:
        groups: dict[str, list[tuple[Request, Any]]] = {}
        for m, run, arg in work:
            groups.setdefault(m, []).append((run, arg))

        def timed(m: str) -> list[tuple[T, float]] | SpecfuseError:
            runs = [r for r, _ in groups[m]]
            began = time.perf_counter()
            try:
                try:
                    outs = call(m, runs, [a for _, a in groups[m]])
                except SpecfuseError:
                    raise
                except Exception as e:  # re-raised with the member's name, never swallowed
                    raise MemberError(f"{m}: {step} failed: {type(e).__name__}: {e}") from e
            except SpecfuseError as e:
                if not self.isolate:
                    raise
                return e
            seconds = time.perf_counter() - began
            profiling.add("member", step, m, seconds=seconds, items=len(runs))
            each = seconds / max(1, len(runs))  # a batch's time, shared out
            return [(o, each) for o in outs]

        names = list(groups)
        if self.workers is None:
            finished: Iterator[tuple[str, list[tuple[T, float]] | SpecfuseError]] = (
                (m, timed(m)) for m in names
            )
        else:
            finished = self.workers.as_completed(timed, names)
        for m, outs in finished:
            if isinstance(outs, SpecfuseError):  # isolate: the runs this call served cannot go on
                for run, _ in groups[m]:
                    self.failures.setdefault(run.id, outs)
                continue
            for (run, _), out in zip(groups[m], outs):
                yield (m, run.id), out

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()
