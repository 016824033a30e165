"""SpecFuse Studio: a training-free ensemble of causal LMs that answer together, segment by segment.

The public API. `Ensemble.stream(prompt)` yields one `Round` per draft → verify → choose cycle;
every view (app, CLI, trace, benchmark, evaluation) consumes that stream. A prompt is a conversation
(`Message`s or {role, content} dicts) or a string, one user message.
"""

__version__ = "0.3.0"  # pyproject.toml reads it; CHANGELOG.md says what changed

from .config import EnsembleConfig, MemberSettings
from .engine import Ensemble, Scheduler, Ticket
from .errors import (
    ConfigError,
    MemberError,
    ModelLoadError,
    PromptTooLongError,
    SpecfuseError,
    TraceError,
    UnknownModelError,
)
from .prompts import Conversation, Message, Prompt
from .records import (
    Branch,
    Candidate,
    Draft,
    ExitEvent,
    Finished,
    MemberTiming,
    Paused,
    Queued,
    Result,
    Round,
    TokenScores,
    answer_spans,
    summarize,
)
from .trace import Trace, dump_trace, load_trace, parse_trace, save_trace

__all__ = [
    "__version__",
    "Branch",
    "Candidate",
    "ConfigError",
    "Conversation",
    "Draft",
    "Ensemble",
    "EnsembleConfig",
    "ExitEvent",
    "Finished",
    "MemberError",
    "MemberSettings",
    "MemberTiming",
    "Message",
    "ModelLoadError",
    "Paused",
    "Prompt",
    "PromptTooLongError",
    "Queued",
    "Result",
    "Round",
    "Scheduler",
    "SpecfuseError",
    "Ticket",
    "TokenScores",
    "Trace",
    "TraceError",
    "UnknownModelError",
    "answer_spans",
    "dump_trace",
    "load_trace",
    "parse_trace",
    "save_trace",
    "summarize",
]
