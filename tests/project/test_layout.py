"""The package's shape, checked statically: a layout by concept, no import circles, small modules,
an engine that asks members nothing outside their protocol, and test modules that import no other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specfuse", "studio")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module `name` imports, wherever the import stands (TYPE_CHECKING blocks and
    function bodies included: a circle dodged by a late import is still a circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_among_the_project_modules():
    modules = _modules()
    known = set(modules)
    # A package's __init__ may name its submodules; a submodule importing its own package's
    # __init__ is how Python imports it, not a dependency of ours.
    graph = {
        name: {t for t in _imports(name, path, known) if not name.startswith(t + ".")}
        for name, path in modules.items()
    }
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph) or [])}"


# Higher layers build on lower ones, never the reverse: the benchmarks use the evaluation and the
# server, all three use the engine; model loading builds members (names → members), so the members
# know nothing of it, nor of anything above; no library module knows the app.
ABOVE_THE_MEMBERS = ("specfuse.engine", "specfuse.serve", "specfuse.eval", "specfuse.bench")
NEVER_IMPORTS = {
    "specfuse.members": (*ABOVE_THE_MEMBERS, "specfuse.models", "specfuse.cli", "specfuse.flags"),
    "specfuse.models": (*ABOVE_THE_MEMBERS, "specfuse.cli", "specfuse.flags"),
    "specfuse.engine": ("specfuse.cli", "specfuse.flags"),
    "specfuse.eval": ("specfuse.bench", "specfuse.serve"),
    "specfuse.serve": ("specfuse.bench", "specfuse.eval"),
    "specfuse": ("studio",),
}


def test_imports_never_run_back_up_the_layers():
    modules = _modules()
    upward = sorted(
        f"{name} imports {target}"
        for name, path in modules.items()
        for layer, above in NEVER_IMPORTS.items()
        if name == layer or name.startswith(layer + ".")
        for target in _imports(name, path, set(modules))
        if any(target == a or target.startswith(a + ".") for a in above)
    )
    assert not upward, upward


# A back end is a folder of members/ (issue 57): it builds on the shared pieces at the top
# (protocol.py, drafting.py, …), never on another back end, so each can be read, moved or dropped alone.
BACK_ENDS = ("specfuse.members.hf", "specfuse.members.llamacpp", "specfuse.members.remote")


def test_each_back_end_is_a_folder_that_imports_no_other():
    modules = _modules()
    for folder in BACK_ENDS:
        assert (ROOT / folder.replace(".", "/") / "__init__.py").is_file(), folder
    crossing = sorted(
        f"{name} imports {target}"
        for name, path in modules.items()
        for folder in BACK_ENDS
        if name == folder or name.startswith(folder + ".")
        for target in _imports(name, path, set(modules))
        if any(target == other or target.startswith(other + ".") for other in BACK_ENDS if other != folder)
    )
    assert not crossing, crossing
    top = [n for n in modules if n.startswith("specfuse.members.") and n.count(".") == 2]
    shared = [n for n in top if n not in BACK_ENDS]
    reaching = sorted(
        f"{name} imports {target}"
        for name in shared
        for target in _imports(name, modules[name], set(modules))
        if any(target == b or target.startswith(b + ".") for b in BACK_ENDS)
    )
    assert not reaching, f"a shared piece of members/ builds on a back end: {reaching}"


def test_the_cycle_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_method_stays_flat_and_small_and_every_module_is_small():
    flat = sorted(p.name for p in (ROOT / "specfuse").glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(flat) <= 12, flat
    sources = [
        *ROOT.glob("*.py"),
        *(p for d in (*PACKAGES, "tests", "tools") for p in (ROOT / d).rglob("*.py")),
    ]
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"over 600 lines: {long}"


def test_concepts_live_in_their_folders():
    for package in ("members", "models", "eval", "bench"):
        assert (ROOT / "specfuse" / package / "__init__.py").is_file()
    protocol = ROOT / "specfuse" / "members" / "protocol.py"
    imported = {
        n.module or "" for n in ast.walk(ast.parse(protocol.read_text())) if isinstance(n, ast.ImportFrom)
    }
    assert not any("torch" in m or "transformers" in m for m in imported)  # a back end reads it alone


def test_the_engine_asks_members_nothing_outside_their_protocol():
    for path in [*(ROOT / "specfuse" / "engine").glob("*.py"), ROOT / "specfuse" / "members" / "workers.py"]:
        name = path.name
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        probes = [
            n.lineno
            for n in calls
            if n.func.id in ("hasattr", "getattr")  # type: ignore[attr-defined]
            and not (isinstance(n.args[0], ast.Name) and n.args[0].id == "_local")  # our thread-local
        ]
        assert not probes, f"{name}: hasattr/getattr at lines {probes}"


def _trees(*folders: str) -> dict[Path, ast.Module]:
    paths = [p for folder in folders for p in (ROOT / folder).rglob("*.py")]
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in paths}


def test_the_engine_wing_holds_the_threads_and_keys_runs_by_their_id():
    """serve/ is HTTP only (the batch's thread and line are the engine's); no object's address
    (id(...)) is a key anywhere, runs are keyed by their own id."""
    for path, tree in _trees("specfuse/serve").items():
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        threads = imported & {"threading", "queue"}
        assert not threads, f"{path.name} imports {threads}"
    addresses = [
        f"{path.relative_to(ROOT)}:{n.lineno}"
        for path, tree in _trees("specfuse", "studio").items()
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "id"
    ]
    assert not addresses, addresses


def test_no_module_reaches_into_another_modules_private_fields():
    """`obj._field` only where `_field` is defined (a Batch's fields are Batch's alone). Third-party
    privates (torch._C, …) are not ours to police: only names some module of ours defines count."""
    trees = _trees("specfuse", "studio")
    defined: dict[Path, set[str]] = {}
    for path, tree in trees.items():
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {
            t.attr
            for n in ast.walk(tree)
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute)
        }
        defined[path] = {n for n in names if n.startswith("_") and not n.startswith("__")}
    ours = set().union(*defined.values())
    reaching = [
        f"{path.relative_to(ROOT)}:{n.lineno} {ast.unparse(n)}"
        for path, tree in trees.items()
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and n.attr in ours - defined[path]
        and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
    ]
    assert not reaching, reaching


# Smaller rooms (issue 42): a file, a function and a class each fit in one reading.
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_CLASS_LINES = 500, 80, 400


def test_code_files_functions_and_classes_stay_small():
    trees = {**_trees("specfuse", "studio"), ROOT / "app.py": ast.parse((ROOT / "app.py").read_text())}
    over = []
    for path, tree in trees.items():
        where = path.relative_to(ROOT)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES:
            over.append(f"{where}: {n} lines")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            cap = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if size > cap:
                over.append(f"{where}: {type(node).__name__} {node.name} {size} lines")
    assert not over, over


def _test_modules_imported(source: str, package: str = "tests") -> set[str]:
    """The test modules (tests.….test_*) that a module of `package` imports: relative or absolute, wherever
    the import stands (a late import in a test body is still an import)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)] if node.level else []
            base = ".".join([*anchor, node.module] if node.module else anchor)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        for name in names:
            parts = name.split(".")
            tested = [i for i, part in enumerate(parts) if part.startswith("test_")]
            if parts[0] == "tests" and tested:
                found.add(".".join(parts[: tested[0] + 1]))
    return found


def test_no_test_module_imports_another():
    """What several test files share lives in a shared module (conftest.py for fixtures, builders.py,
    scripted.py, runs.py, helpers_*.py), never in a test file that others import."""
    importing = {}
    for path in (ROOT / "tests").rglob("*.py"):
        package = ".".join(path.parent.relative_to(ROOT).parts)
        itself = f"{package}.{path.stem}"
        others = _test_modules_imported(path.read_text(encoding="utf-8"), package) - {itself}
        if others:
            importing[str(path.relative_to(ROOT))] = sorted(others)
    assert not importing, importing


WINGS = {"engine", "trace", "members", "models", "serve", "bench", "eval"}
WINGS |= {"studio", "classroom", "browser", "project"}


def test_tests_live_in_a_folder_per_wing():
    """Tests mirror the code's wings (CONTRIBUTING.md's table); the top of tests/ holds only what the
    wings share (conftest, builders, scripted, runs, helpers_*), data/ its files."""
    tests = ROOT / "tests"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in {"data", "__pycache__"}}
    assert not loose, f"test files outside a wing's folder: {loose}"
    assert folders == WINGS, folders ^ WINGS
    for wing in WINGS:
        assert (tests / wing / "__init__.py").exists(), wing  # two wings may each have a test_cli.py
        assert list((tests / wing).glob("test_*.py")), f"tests/{wing}/ is empty"


def test_the_test_import_check_sees_every_spelling():
    seen = [
        "from .test_engine import ascii_only",
        "from . import test_engine",
        "import tests.test_engine",
        "from tests.test_engine import ascii_only",
        "from tests import test_engine",
        "def test_x():\n    from .test_engine import ascii_only",
    ]
    for source in seen:
        assert _test_modules_imported(source) == {"tests.test_engine"}, source
    wing = {"tests.engine.test_engine"}
    assert _test_modules_imported("from ..engine.test_engine import ascii_only", "tests.serve") == wing
    assert _test_modules_imported("from .test_engine import x", "tests.engine") == wing
    assert _test_modules_imported("from tests.engine import test_engine") == wing
    shared = ["from .conftest import tiny_member", "from . import runs", "import tests.runs", "import tests"]
    for source in shared:
        assert _test_modules_imported(source) == set(), source
