"""The handout tests' runs (classroom/test_handout, browser/test_handout): a hostile one whose prompt, member
names and candidates hold markup, and a long one of 60 rounds of 8 members, both played by the
engine with scripted members; and reading the data back out of an exported page."""

from __future__ import annotations

import json
import re

from specfuse import Ensemble, EnsembleConfig, Trace

from .scripted import ScriptedMember

XSS_SCRIPT = "</script><script>alert(1)</script>"
XSS_IMG = "<img src=x onerror=alert(1)>"
# Member names must be printable: the line separators go into the prompt and the candidates.
HOSTILE_MEMBERS = (XSS_SCRIPT, f"{XSS_IMG} \"double\" 'single'", 'quote " & amp; <!-- -->')
HOSTILE_PROMPT = f"Say {XSS_SCRIPT} and {XSS_IMG}\u2028next line\u2029 \"quoted\" 'single' & <b>bold</b>"
HOSTILE_DRAFTS = (
    f"{XSS_SCRIPT} one ",
    f'{XSS_IMG} "two" ',
    "three\u2028four\u2029 <!-- &amp; ",
)
DATA = re.compile(r'<script type="application/json" id="specfuse-data">(.*?)</script>', re.S)


def hostile_trace(rounds: int = 8) -> Trace:
    """Members with markup in their names drafting markup, U+2028/U+2029 and quotes: the first
    always wins, the others exit in turn (rounds 6 and 7), so round 8 is a lone, unverified draft."""
    favourite = HOSTILE_DRAFTS[0]
    members = [
        ScriptedMember(name, [draft] * 50, lambda text: 2.0 if text == favourite else 1.0)
        for name, draft in zip(HOSTILE_MEMBERS, HOSTILE_DRAFTS)
    ]
    config = EnsembleConfig(max_rounds=rounds, exit_warmup=1)
    return Trace(
        HOSTILE_PROMPT, HOSTILE_MEMBERS, config, tuple(Ensemble(members, config).stream(HOSTILE_PROMPT))
    )


def long_trace(rounds: int = 60, members: int = 8, chars: int = 1000) -> Trace:
    """`rounds` rounds in which all `members` draft a candidate of about `chars` characters (English
    with some Chinese, different every round), every one verified; nobody exits."""
    names = [f"member-{i}" for i in range(members)]
    scripted = []
    for i, name in enumerate(names):
        drafts = []
        for k in range(rounds):
            words = f"Round {k} from {name}: the quick brown fox {i * k} jumps 狐狸跳过了懒狗 "
            drafts.append((words * (chars // len(words) + 1))[:chars])
        scripted.append(ScriptedMember(name, drafts, lambda text, i=i: float(len(text) % (i + 3))))
    config = EnsembleConfig(max_rounds=rounds, exit=False, max_new_tokens=100_000)
    return Trace(
        "Tell a long story.",
        tuple(names),
        config,
        tuple(Ensemble(scripted, config).stream("Tell a long story.")),
    )


def page_json(page: str) -> dict:
    """The run's data embedded in an exported page, decoded."""
    (found,) = DATA.findall(page)
    return json.loads(found)
