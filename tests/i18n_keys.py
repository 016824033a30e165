"""Where the UI's English texts are, for tests/studio/test_i18n.py: the keys the code asks `_()` for (read
from the source, so a new `_("…")` is found without running it), the page's fixed text (the built
page's components), the lessons' texts and the key map. The English-word detector the tests share."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from specfuse.handout import keys as keymap
from specfuse.lessons import LESSONS

ROOT = Path(__file__).resolve().parents[1]
STOP_REASONS = ("stop", "empty", "final", "budget", "rounds")  # the engine's, shown on the status line

# English a Chinese page may keep: names (the method, the app, the members and their makers), keys
# on the keyboard, units, file kinds, and the settings' code names (their values, not their labels).
ALLOWED = {
    *["specem", "specfuse", "studio", "gradio", "sweetspan"],
    *["smollm", "smollm2", "gemma", "qwen", "qwen2", "coder", "huggingfacetb", "google"],
    *["pagedown", "pageup", "esc", "home", "end", "space", "enter", "tab"],
    *["json", "png", "html", "url", "api", "gpu", "cpu", "cuda", "auto", "gsm8k", "ifeval"],
    *["zsoftmax", "minmax", "softmax", "logit", "logprob", "log", "exp", "top", "llama", "cpp", "docs", "md"],
}
WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]+")


def english_words(text: str, allowed: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The English words of `text` a translated page should not show: words of two letters or
    more, less names, keys and code names (ALLOWED, and `allowed`: member names, model text)."""
    keep = {w.lower() for w in allowed} | ALLOWED
    out = []
    text = re.sub(r"[\w./-]+\.(md|json|html|png)\b", " ", text)  # a file's name (docs/evaluation.md)
    for word in WORD.findall(text):
        low = word.lower()
        if low in keep or any(low in name for name in keep if len(low) > 2 and "-" in name):
            continue
        if "_" in low or re.fullmatch(r"[a-z]?[0-9.]+[a-z]?", low):  # code names (loop_guard, z_ij), 1.5b
            continue
        out.append(word)
    return out


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "text" (and A, B = "x", "y") assignments."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = []
                if isinstance(target, ast.Name):
                    pairs = [(target, node.value)]
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for name, value in pairs:
                    if (
                        isinstance(name, ast.Name)
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                    ):
                        out[name.id] = value.value
    return out


def asked(paths: list[Path] | None = None) -> Iterator[tuple[str, str]]:
    """(where, key) for every `_(…)` in the app's source and `say(…)` in the slide's (png.py) whose
    text is a literal or a module constant; of anything else, left to the rendered-page tests."""
    handout = ROOT / "specfuse" / "handout"
    for path in paths or [*sorted((ROOT / "studio").glob("*.py")), handout / "png.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _constants(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("_", "say")
                and node.args
            ):
                arg = node.args[0]
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield where, arg.value
                elif isinstance(arg, ast.Name) and arg.id in names:
                    yield where, names[arg.id]


def lesson_texts() -> Iterator[str]:
    for one in LESSONS:
        yield from (one.title, one.summary, one.takeaway, one.live_note, *one.look_for.values())


def key_texts() -> Iterator[str]:
    for shown, does in (*keymap.key_rows(keymap.APP), *keymap.key_rows(keymap.HANDOUT)):
        yield does
        if english_words(shown):
            yield shown


def trace_words(trace) -> set[str]:
    """Words a page may show untranslated: the run's members, prompt and every candidate's text."""
    text = " ".join(
        [*trace.members, str(trace.prompt)] + [c.text for r in trace.rounds for c in r.candidates]
    )
    return set(re.findall(r"[A-Za-z][A-Za-z0-9_]+", text))
