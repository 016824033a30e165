"""The package as others get it: a wheel built from the source, installed into a fresh virtual
environment with the locked dependencies, runs its `specfuse` entry point on a tiny local model.

The new venv gets the wheel and, linked from this environment, exactly the dependencies the wheel
declares (link_dependencies).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from specfuse import __version__, load_trace

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: int = 900) -> str:
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{argv[:3]} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def tracked_copy(dest: Path) -> Path:
    """The files git tracks (or, without git, the tree minus build outputs): a clean clone's view."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in listed.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        skip = {
            ".venv",
            ".git",
            "build",
            "dist",
            "__pycache__",
            ".pytest_cache",
            ".mypy_cache",
            ".ruff_cache",
        }
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]
    for name in names:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def declared(requirements: list[str]) -> set[str]:
    """The distributions the requirements name, with what those require in turn (no extras)."""
    names: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in names:
            names.add(name)
            todo += importlib.metadata.distribution(name).requires or []
    return names


def link_dependencies(wheel: Path, venv: Path, folder: Path) -> int:
    """The wheel's declared dependencies, and nothing else of this environment, on the fresh venv's
    path: each one's files as installed here, linked into `folder`, which a .pth file adds. A module
    the package imports without declaring it is missing there, as in a user's install; pip resolving
    the pins is `make install`'s part (resolving them again from the index took 80 s of the suite)."""
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"specfuse-{__version__}.dist-info/METADATA").decode()
    lines = metadata.splitlines()
    needed = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    folder.mkdir()
    names = declared(needed)
    for name in names:
        dist = importlib.metadata.distribution(name)
        for top in sorted({f.parts[0] for f in dist.files or () if f.parts[0] != ".."}):
            if not (folder / top).exists() and Path(str(dist.locate_file(top))).exists():
                (folder / top).symlink_to(Path(str(dist.locate_file(top))))
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "dependencies.pth").write_text(f"{folder}\n", encoding="utf-8")
    return len(names)


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """(wheel, venv bin folder): the wheel built once and installed once per test run."""
    root = tmp_path_factory.mktemp("packaging")
    source = tracked_copy(root / "source")
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        root / "dist",
        source,
        cwd=root,
    )
    (wheel,) = (root / "dist").glob("specfuse-*.whl")
    run(sys.executable, "-m", "venv", root / "venv", cwd=root)  # fresh: no system site-packages
    bin_dir = root / "venv" / "bin"
    assert link_dependencies(wheel, root / "venv", root / "dependencies") >= 20
    run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=root)
    return wheel, bin_dir


@pytest.mark.slow
def test_the_wheel_carries_its_metadata_licence_and_type_marker(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"specfuse-{__version__}.dist-info/METADATA").decode()
    assert "specfuse/py.typed" in names
    # The handout's page, style and player ship beside its modules (pyproject's package data).
    assert {f"specfuse/handout/{n}" for n in ("page.html", "player.css", "player.js")} <= names
    shipped = {f"specfuse/lessons/traces/{p.name}" for p in (ROOT / "specfuse/lessons/traces").glob("*.json")}
    assert shipped and shipped <= names, sorted(shipped - names)  # the lessons open from the wheel
    assert {f"specfuse-{__version__}.dist-info/licenses/{n}" for n in ("LICENSE", "NOTICE")} <= names
    assert f"Version: {__version__}" in metadata and "License-Expression: Apache-2.0" in metadata
    for dep in ("torch", "transformers", "accelerate", "safetensors", "gguf", "tqdm", "pydantic"):
        assert f"Requires-Dist: {dep}" in metadata
    assert 'extra == "app"' in metadata and 'extra == "eval"' in metadata and 'extra == "dev"' in metadata
    assert not any(n.startswith(("tests/", "app.py")) for n in names)


@pytest.mark.slow
def test_the_installed_entry_point_lists_models_and_answers(installed, tiny_checkpoints, tmp_path):
    _, bin_dir = installed
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECFUSE_CACHE": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)  # the installed copy, not this checkout
    where = run(
        bin_dir / "python",
        "-c",
        "import specfuse; print(specfuse.__file__, specfuse.__version__)",
        cwd=tmp_path,
        env=env,
    )
    assert str(bin_dir.parent) in where and where.split()[1] == __version__
    opened = run(
        bin_dir / "python",
        "-c",
        "from specfuse.lessons import LESSONS, load_lesson, shows\n"
        "print(sum(shows(x.slug, load_lesson(x.slug)) is None for x in LESSONS), len(LESSONS))",
        cwd=tmp_path,
        env=env,
    )
    showing, lessons = opened.split()
    assert showing == lessons and int(lessons) >= 6  # every lesson opens from the installed wheel
    listing = run(bin_dir / "specfuse", "--list-models", cwd=tmp_path, env=env)
    assert "smollm2-135m" in listing and "qwen2.5-coder-0.5b" in listing
    trace = tmp_path / "run.json"
    answer = run(
        bin_dir / "specfuse",
        "--models",
        ",".join(tiny_checkpoints),
        "--max-new-tokens",
        "8",
        "--quiet",
        "--trace",
        trace,
        "Hello there",
        cwd=tmp_path,
        env=env,
    )
    saved = load_trace(trace)
    assert answer == saved.result.answer + "\n" and saved.members == tuple(tiny_checkpoints)
    assert json.loads(trace.read_text(encoding="utf-8"))["version"] == 3
