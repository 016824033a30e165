"""The package as others get it: a wheel built from the source, installed into a fresh virtual
environment with the locked dependencies, runs its `specfuse` entry point on a tiny local model.

Slow: it installs torch and transformers into a new venv (from the wheels on disk, as `make` does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specfuse import __version__, load_trace

ROOT = Path(__file__).resolve().parents[2]
LOCKED_TORCH = next(
    line.split("#")[0].strip()
    for line in (ROOT / "requirements.txt").read_text().splitlines()
    if line.startswith("torch==")
)


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
    run(bin_dir / "python", "-m", "pip", "install", "-q", LOCKED_TORCH, cwd=root)  # the CPU wheel on disk
    run(bin_dir / "python", "-m", "pip", "install", "-q", "-c", ROOT / "requirements.txt", wheel, cwd=root)
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
