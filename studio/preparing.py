"""A run's members being prepared, said on the status line while it waits for them.

The first run of a member may wait most of a minute (converted, loaded, warmed up: studio.loading,
specfuse.models.preparation); a page that says only "processing" then looks broken. A run loads its
members on a thread of its own through `Preparing`, and its handler shows `status()` (which member,
which step, seconds so far, how long it usually takes on this machine) and drives Gradio's
progress bar from it every POLL_S, from its own thread. Members already loaded say nothing.

Knows nothing about components: the handlers put the text where it goes.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specfuse.models.preparation import STEPS, step_of

from .i18n import _
from .untrusted import md

if TYPE_CHECKING:
    from specfuse.members.protocol import Member

    from .loading import Load

POLL_S = 0.25  # how often a waiting run's status line and progress bar are refreshed
# A wait shorter than this (members already loaded, or quick to load) keeps Gradio's own bar alone:
# the status line's first word hides that bar, and flickering it for a moment says nothing.
SAY_AFTER_S = 1.0

# load(names, device, progress, begin): Studio.load, which calls begin(name, device) as each member starts
PrepareLoad = Callable[..., "list[Member]"]


@dataclass
class Preparing:
    """Members loading on a thread of their own (`start`), watched by the run that waits for them.

    `under_way(name, device)`: the shared loader's Load of that member, when someone is loading it
    (a Run pressed while the app prepares its members waits for that load: its start time, its
    steps and how long it usually takes are that load's)."""

    names: Sequence[str]
    under_way: Callable[[str, str], Load | None] = lambda name, device: None
    member: str | None = None
    device: str = ""
    began: float = field(default_factory=time.perf_counter)
    fraction: float = 0.0
    message: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    members: list[Member] | None = None
    error: BaseException | None = None
    created: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(
        cls,
        load: PrepareLoad,
        names: Sequence[str],
        device: str,
        under_way: Callable[[str, str], Load | None] | None = None,
    ) -> Preparing:
        job = cls(list(names)) if under_way is None else cls(list(names), under_way)

        def work() -> None:
            try:
                job.members = load(list(names), device, job.report, job.begin)
            except BaseException as e:  # raised again in the waiting handler's thread (result)
                job.error = e
            finally:
                job.done.set()

        threading.Thread(target=work, name="specfuse-prepare-run", daemon=True).start()
        return job

    def begin(self, name: str, device: str) -> None:
        self.member, self.device, self.began = name, device, time.perf_counter()

    def report(self, fraction: float, desc: str = "") -> None:
        self.fraction, self.message = fraction, desc

    def result(self) -> list[Member]:
        """The members once done, or the load's error."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.members is not None
        return self.members

    def status(self) -> str | None:
        """The status line while the members are prepared (Markdown, every name escaped), or None
        before the first member has begun."""
        if self.member is None:
            return None
        load = self.under_way(self.member, self.device)
        step = step_of(self.message) or "loading"  # the step's English name, STEPS' key
        since = load.began if load is not None else self.began
        index = self.names.index(self.member) if self.member in self.names else 0
        # Capturing CUDA graphs is a step on a GPU only (members/hf/slots.py): elsewhere, one fewer.
        steps = STEPS if "cuda" in self.device or step == "capturing graphs" else STEPS[:-1]
        parts = [
            _(
                "**Preparing the members** (once; then they stay loaded): **{member}** ({i} of {n}), "
                "**{step}** (step {s} of {steps})",
                member=md(self.member),
                i=index + 1,
                n=len(self.names),
                step=_(step),
                s=steps.index(step) + 1,
                steps=len(steps),
            ),
            f"{bar(self.fraction)} {self.fraction:.0%}",
            _("{s} s so far", s=f"{time.perf_counter() - since:.0f}"),
        ]
        if load is not None and load.usual:
            parts.append(md(usual_said(load.usual)))
        after = [md(n) for n in self.names[index + 1 :]]
        if after:
            parts.append(_("then {names}", names=", ".join(after)))
        return " · ".join(parts)


# specfuse.models.preparation.usual_text's two sentences, said again in the page's language.
WHEN = r"(the first time \(converting\)|from the cache)"
USUAL = re.compile(WHEN + r" it usually takes about (\d+) s on this machine \(measured (once|\d+ times)\)")
UNMEASURED = re.compile(
    r"no measurement yet on this machine of preparing it " + WHEN + ": this one is being timed"
)


def usual_said(text: str) -> str:
    """How long preparing usually takes here (the loader's English sentence) in the current language."""
    found, none = USUAL.fullmatch(text), UNMEASURED.fullmatch(text)
    if none is not None:
        return _(
            "no measurement yet on this machine of preparing it {when}: this one is being timed",
            when=_(none[1]),
        )
    if found is None:
        return text
    count = found[3].split()[0]
    times = _("once") if count == "once" else _("{n} times", n=count)
    return _(
        "{when} it usually takes about {s} s on this machine (measured {times})",
        when=_(found[1]),
        s=found[2],
        times=times,
    )


def bar(fraction: float, cells: int = 12) -> str:
    """A progress bar in text, for the status line: Gradio hides its own bar once a run has yielded
    an update (the status line is one), and the presenter view shows only the status line."""
    full = round(min(max(fraction, 0.0), 1.0) * cells)
    return "▰" * full + "▱" * (cells - full)


def relay(job: Preparing, progress: Any, last: str | None) -> str | None:
    """Gradio's progress bar from the job (in the handler's own thread); the status text when it
    changed since `last` (and the wait has lasted SAY_AFTER_S), else None."""
    if job.message:
        progress(job.fraction, desc=job.message)
    if time.perf_counter() - job.created < SAY_AFTER_S:
        return None
    text = job.status()
    return text if text != last else None
