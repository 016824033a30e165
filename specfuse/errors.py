"""The project's exceptions: errors a user can fix, each with a message that says what to do next.

Knows nothing about the CLI or the app; they translate these at their edges.
"""

from __future__ import annotations


class SpecfuseError(Exception):
    """An error the user can fix. The CLI prints it and exits 2; the app shows it with gr.Error."""


class UnknownModelError(SpecfuseError, KeyError):
    """A model name that is neither in the catalogue nor an allowed path or hub id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ModelLoadError(SpecfuseError):
    """A model that exists by name but could not be installed, assembled, converted or loaded."""


class ConfigError(SpecfuseError, ValueError):
    """An impossible setting or input (segment length, temperature, empty prompt, …)."""


class PromptTooLongError(ConfigError):
    """A prompt that does not fit a member's context window together with the answer budget."""


class TraceError(SpecfuseError, ValueError):
    """A trace file that is malformed, oversized or of an unknown schema version."""


class MemberError(SpecfuseError):
    """A member that failed while drafting, scoring or accepting; the message names it."""
