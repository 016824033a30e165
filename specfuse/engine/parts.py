"""How much of the newcomers' prompts the members read between two rounds (chunked prefill).

A fixed number of tokens does not bound a part's time: late in a long prompt a part attends over
thousands of tokens read before it, and a part that takes a round on a GPU takes several on two CPU
cores (issue 56: 256-token parts left a 3.4x gap in the streams under way, 96-token parts 2.9x). So
the part is sized by time: each part is given the tokens that, at the rate the last part was read,
take PART_OF_A_ROUND of the last round's time (or UNNOTICED_S, if longer), so that a stream's gap
while a prompt is read stays under twice its usual one, or a quarter second more. The rate is
measured again on every part, which follows the prompt's growing context, the machine's load and the
hardware without a model of any of them. The operator's prefill_chunk is the most a part may hold;
with nobody streaming a part holds that much (nobody waits).

Pure: times in, token counts out (tests/engine/test_parts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A part's time, at most this share of a round's: a margin for the estimate. At 0.75 a stream's longest
# gap while a 6,000-token prompt was read came out 1.85x and 2.28x its usual one (target 2): late parts
# attend over more of the prompt than the part they are sized from, and rounds vary. At 0.5: 1.61x.
PART_OF_A_ROUND = 0.5
# ... or this long, whatever the round: a pause under a quarter second in a stream goes unnoticed, and
# smaller parts cost more per token than they spare (tiny models' rounds take milliseconds: read in
# 8-token parts, every short prompt took several rounds to start and a soak of short requests slowed 3×).
UNNOTICED_S = 0.25
FIRST_PART = 32  # tokens, before any part has been timed, after slow rounds: nothing is known of the rate
GROWTH = 2.0  # a part at most this many times the last one: a short last part overstates the rate
LEAST = 8  # tokens: below this a part's fixed costs (a call per member) outweigh its reading


@dataclass
class PartSizer:
    """The next part's tokens, from the last round's time and the last part's rate."""

    most: int  # the operator's prefill_chunk (> 0)
    tokens: int = field(init=False)  # the next part's size while runs stream
    round_s: float | None = None  # the last round's time, None before one was timed
    rate_known: bool = False  # a part has been timed

    def __post_init__(self) -> None:
        self.tokens = min(self.most, FIRST_PART)

    def size(self, streaming: bool) -> int:
        """The next part's tokens: timed to the rounds while runs stream, else the most allowed."""
        return self.tokens if streaming else self.most

    def round_took(self, seconds: float) -> None:
        self.round_s = seconds
        if not self.rate_known:  # rounds this quick (a GPU, tiny models): a first part of the cap is cheap
            self.tokens = self.most if seconds < UNNOTICED_S else min(self.most, FIRST_PART)

    def part_took(self, tokens: int, seconds: float) -> None:
        """A part of `tokens` (what each member was allowed) took `seconds`: size the next one."""
        if self.round_s is None or seconds <= 0 or tokens <= 0:
            return
        self.rate_known = True
        fits = tokens * max(PART_OF_A_ROUND * self.round_s, UNNOTICED_S) / seconds
        grown = min(fits, tokens * GROWTH)
        self.tokens = max(min(LEAST, self.most), min(self.most, int(grown)))
