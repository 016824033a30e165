"""What a member is: the four calls every back end answers, the capabilities it may offer beyond
them (each with a default in BaseMember), and what it tells the engine about where it runs.

Knows nothing about tensors, tokenizers, servers or processes: hf/, llamacpp/, remote/ and process.py
implement this protocol, and a new back end needs nothing but this file. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..config import MemberSettings
from ..errors import ConfigError, MemberError, SpecfuseError
from ..prompts import Prompt
from ..records import Candidate, TokenScores

HERE = "this process"  # a member's `host` when its work runs in the engine's own process

# What a verifier says of one request's candidates: the raw scores z_i· and, from members that keep
# it, the token-level evidence behind them (one TokenScores per candidate; empty when not kept).
Verdict = tuple[list[float], tuple[TokenScores, ...]]


@runtime_checkable
class Member(Protocol):
    """One model in the ensemble. A member is shared by all runs; everything that belongs to one
    request (token ids, caches, a random generator) lives in the state that start() returns, which
    the engine never looks into."""

    name: str  # unique within an ensemble; shown in every view
    device: str  # where its weights are: "cpu", "cuda:0", …; "server" for a served model
    host: str  # where its work runs: HERE, "process 1234" (a worker process), or a server's address
    trust: float | None  # its starting say under prior="trust" (evidence); None: no evidence
    parameters: float | None  # its size, to divide a shared CPU's cores; None: not ours to divide
    cpu_turns: bool  # on a shared CPU, faster in turns with all the cores than at once on a share

    # -- required: the round's calls for one request -------------------------------------------------

    def start(self, prompt: Prompt, settings: MemberSettings) -> Any:
        """A new request's state: the prompt (a conversation, or a string: one user message) in the
        member's own format (its chat template, or its completion rendering), ready to draft from.
        The messages' text is text: a control token's text in it never becomes the control token."""
        ...

    def draft(self, state: Any, max_new_tokens: int) -> Candidate:
        """Continue the request's context by at most `max_new_tokens` tokens (step 1, draft)."""
        ...

    def score(self, state: Any, candidates: Sequence[Candidate]) -> list[float]:
        """Raw scores z_i· of every candidate in the request's context (step 2, verify)."""
        ...

    def accept(self, state: Any, text: str) -> None:
        """Append the winner's text to the request's context (step 7, accept)."""
        ...

    # -- optional capabilities (BaseMember gives each a default) -----------------------------------

    def start_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        """start() for several requests at once (settings[i] is prompt i's); a member that can read
        the prompts together does it in fewer passes. Each entry is that request's state, or the
        SpecfuseError that request cannot start with: one bad prompt fails only its own request."""
        ...

    def open_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        """start_many() without reading the prompts (chunked prefill): each request's state with its
        prompt formatted and its token count checked against the member's context, or the
        SpecfuseError it cannot start with; prefill_many() then reads it, a part at a time."""
        ...

    def prefill_many(self, states: Sequence[Any], budget: int) -> list[bool]:
        """Read at most `budget` more tokens of these requests' prompts in all (states from
        open_many), the first request's first; whether each prompt is now read whole, its state
        ready to draft. A member whose reading happens elsewhere (a server) may say False until it
        has, and never holds the batch up waiting for it."""
        ...

    def draft_many(self, states: Sequence[Any], budgets: Sequence[int]) -> list[Candidate]:
        """draft() for several requests at once; a member that can batch them does it in one pass."""
        ...

    def score_many(self, states: Sequence[Any], candidates: Sequence[Sequence[Candidate]]) -> list[Verdict]:
        """score() for several requests at once, with the token-level evidence when the member keeps it."""
        ...

    def prompt_surprise(self, state: Any) -> float | None:
        """Nats per byte of the prompt's own text (prior="prompt"); None: the member cannot tell."""
        ...

    def set_threads(self, threads: int) -> None:
        """The CPU threads its work may use from now on, when that work runs in a process of its own
        (members in the engine's process get their share on their worker thread instead)."""
        ...

    def sharing(self, name: str) -> Member:
        """Another member called `name` on this one's weights, with contexts of its own: a model
        listed twice, sampled with another seed, costs its memory once. Each back end says how (a
        ConfigError where it cannot: a server, a worker process)."""
        ...


class BaseMember:
    """The optional half of the protocol, done the simple way: a back end subclasses this, writes
    the four required calls, and overrides a capability only when it can do better."""

    name: str
    device: str = "cpu"
    host: str = HERE
    trust: float | None = None
    parameters: float | None = None
    # On a CPU it shares with other members: faster in turns, each with all the cores, than at once
    # on a share of them (run_concurrently, workers.py). LlamaCppMember on AVX2 kernels says so.
    cpu_turns: bool = False

    def start(self, prompt: Prompt, settings: MemberSettings) -> Any:
        raise NotImplementedError

    def draft(self, state: Any, max_new_tokens: int) -> Candidate:
        raise NotImplementedError

    def score(self, state: Any, candidates: Sequence[Candidate]) -> list[float]:
        raise NotImplementedError

    def accept(self, state: Any, text: str) -> None:
        raise NotImplementedError

    def start_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        return each_request(self.name, self.start, prompts, settings)

    def open_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        # A member that cannot read a prompt in parts reads it whole here; prefill_many has no more to do.
        return self.start_many(prompts, settings)

    def prefill_many(self, states: Sequence[Any], budget: int) -> list[bool]:
        return [True] * len(states)

    def draft_many(self, states: Sequence[Any], budgets: Sequence[int]) -> list[Candidate]:
        return [self.draft(s, b) for s, b in zip(states, budgets)]

    def score_many(self, states: Sequence[Any], candidates: Sequence[Sequence[Candidate]]) -> list[Verdict]:
        return [(list(self.score(s, c)), ()) for s, c in zip(states, candidates)]

    def prompt_surprise(self, state: Any) -> float | None:
        return None

    def set_threads(self, threads: int) -> None:
        return None

    def sharing(self, name: str) -> Member:
        raise ConfigError(f"{self.name} cannot share its weights with a second member; list it once")


def each_request(
    name: str,
    start: Callable[[Prompt, MemberSettings], Any],
    prompts: Sequence[Prompt],
    settings: Sequence[MemberSettings],
) -> list[Any]:
    """`start(prompt, settings)` for each request, one at a time: its state, or the error it fails
    with (a SpecfuseError as raised, anything else a MemberError naming member `name`), so that one
    bad prompt fails only its own request."""
    out: list[Any] = []
    for prompt, s in zip(prompts, settings):
        try:
            out.append(start(prompt, s))
        except SpecfuseError as e:
            out.append(e)
        except Exception as e:  # this request's alone, named as a failed call is
            error = MemberError(f"{name}: start failed: {type(e).__name__}: {e}")
            error.__cause__ = e
            out.append(error)
    return out


def in_this_process(member: Member) -> bool:
    return member.host == HERE


def shares_cpu(member: Member) -> bool:
    """Its torch work runs on this machine's CPU (here or in a worker process), so it takes a share
    of the cores; a server's work, or a member that does not give its size, is not ours to divide."""
    return member.device.startswith("cpu") and member.parameters is not None


__all__ = ["HERE", "BaseMember", "Member", "Verdict", "each_request", "in_this_process", "shares_cpu"]
