"""The library's front door: Ensemble answers prompts with several members (SpecEM), one prompt or
many in lockstep, round by round. It plays them in a Batch (batch.py) of its own, on this thread."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence

from ..config import PARALLEL_MODES, EnsembleConfig
from ..errors import ConfigError, SpecfuseError
from ..limits import check_request
from ..members.protocol import Member
from ..members.workers import run_concurrently
from ..prompts import Prompt
from ..records import Draft, Result, Round, summarize
from .batch import Batch
from .run import TYPED, Run


class Ensemble:
    """Several members answering prompts together (SpecEM). Members are shared, runs are not."""

    def __init__(
        self, members: Sequence[Member], config: EnsembleConfig | None = None, *, parallel: str = "auto"
    ) -> None:
        """`parallel`: whether the members work at the same time (config.PARALLEL_MODES); a property
        of where they run, so it is the ensemble's, not a run's."""
        if parallel not in PARALLEL_MODES:
            raise ConfigError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {parallel!r}")
        if not members:
            raise ConfigError("an ensemble needs at least one member")
        for m in members:
            if not isinstance(m, Member):
                raise ConfigError(
                    f"{m!r} is not a member: it must offer everything in specfuse.members.protocol.Member "
                    "(subclass BaseMember there for the optional parts)"
                )
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ConfigError(f"member names must be unique, got {', '.join(names)}")
        if TYPED in names:
            raise ConfigError(f"{TYPED!r} is reserved for typed segments; rename that member")
        for name in names:  # a name is a key, a label and a trace field (calls.without_prompt)
            if not name.strip() or not name.isprintable():
                raise ConfigError(f"member name {name!r}: it must be printable text, not blank")
        self.members: tuple[Member, ...] = tuple(members)
        self.config = config or EnsembleConfig()
        self.parallel = parallel

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def stream(
        self,
        prompt: Prompt,
        config: EnsembleConfig | None = None,
        *,
        start: Sequence[Round] = (),
        forced: str | None = None,
        origin: str = TYPED,
    ) -> Iterator[Round]:
        """Yield one Round per cycle; the last one has stop_reason set.

        `prompt`: a conversation (prompts.Message objects or {"role", "content"} dicts: an optional
        system message first, then user and assistant turns, ending with the user's), which each
        member renders with its own chat template; or a string, one user message.

        Branching: `start` holds the first rounds of an earlier run of the same prompt (from a live
        run or a trace). They are not drafted again: every member's state is rebuilt from their
        answer, and weights, qualities and exits continue from where they stood. With `forced`, the
        next round's winner is that text: one of its candidates (by text), or a segment typed by a
        person (`origin`), which every verifier scores like any candidate.

        Stopping early is closing the generator: every state lives inside this call, so nothing
        is left behind and the next call starts clean.
        """
        for event in self.events(prompt, config, start=start, forced=forced, origin=origin):
            if isinstance(event, Round):
                yield event

    def events(
        self,
        prompt: Prompt,
        config: EnsembleConfig | None = None,
        *,
        start: Sequence[Round] = (),
        forced: str | None = None,
        origin: str = TYPED,
    ) -> Iterator[Draft | Round]:
        """stream(), with each candidate also yielded as a Draft the moment its drafter is done.

        With members at the same time (parallel), the fastest member's candidate arrives first: a
        view shows it while the others are still drafting, instead of waiting for the whole round.
        """
        run = Run(prompt, config or self.config, self.names, start, forced, origin)
        for _, event in self._lockstep([run]):
            yield event

    def stream_many(
        self,
        prompts: Sequence[Prompt],
        config: EnsembleConfig | Sequence[EnsembleConfig] | None = None,
        *,
        batch_size: int | None = None,
    ) -> Iterator[tuple[int, Round]]:
        """Answer several prompts in lockstep; yield (prompt index, Round) as rounds finish.

        `config` is one config for all prompts or one per prompt (a study runs its variants side by
        side). A member asked for several prompts at once batches them when it can (HFMember does);
        each prompt's rounds are those stream() yields for it alone (exactly in fp32 greedy, up to
        batched arithmetic's rounding otherwise). At most `batch_size` prompts (default: all) are
        under way at once: a finished prompt drops out and the next waiting one takes its place.
        """
        configs = _per_prompt(config or self.config, len(prompts))
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        runs = [Run(p, c, self.names) for p, c in zip(prompts, configs)]
        for i, event in self._lockstep(runs, batch_size or max(1, len(runs))):
            if isinstance(event, Round):
                yield i, event

    def run(self, prompt: Prompt, config: EnsembleConfig | None = None) -> Result:
        """The whole answer and its totals, for scripts: a consumer of stream()."""
        return summarize(list(self.stream(prompt, config)))

    # -- the loop ------------------------------------------------------------------------------------

    def _lockstep(self, runs: list[Run], batch_size: int = 1) -> Iterator[tuple[int, Draft | Round]]:
        for run in runs:  # limits.py: every bound that needs no model, before any model work
            check_request(run.prompt, run.config, run.start, run.forced, run.names)
        batch = Batch(self.members, run_concurrently(self.members, self.parallel))
        index = {run.id: i for i, run in enumerate(runs)}
        waiting = collections.deque(runs)

        def take(room: int) -> list[Run]:
            return [waiting.popleft() for _ in range(min(room, len(waiting)))]

        try:
            while waiting or batch.live:
                for _, error in batch.admit(take, batch_size):
                    raise error  # every run here needs every member: one failure ends them all
                for run, event in batch.step():
                    if isinstance(event, SpecfuseError):
                        raise event
                    yield index[run.id], event
        finally:
            batch.close()


def _per_prompt(config: EnsembleConfig | Sequence[EnsembleConfig], n: int) -> list[EnsembleConfig]:
    if isinstance(config, EnsembleConfig):
        return [config] * n
    configs = list(config)
    if len(configs) != n:
        raise ConfigError(f"{n} prompts but {len(configs)} configs; give one config or one per prompt")
    return configs
