"""Names → what they name: which kind of member a name is (catalogue, server, folder, GGUF file,
hub id), who may use it, its tokenizer alone, and the errors that say why a name cannot load.

Knows nothing about torch or how a member is built: loading.py builds one from what this decides.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specfuse.errors import ModelLoadError, UnknownModelError
from specfuse.prompts import CHAT, QA_COMPLETION, PromptFormat

from .cache import Progress, assemble_gguf, cache_root, cached_folder, no_progress
from .catalogue import CATALOGUE, ModelEntry, installed_models
from .devices import gpu_count

if TYPE_CHECKING:
    from specfuse.members.protocol import Member

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def unknown_model(name: str, allow_paths: bool) -> UnknownModelError:
    hint = " Give a local checkpoint folder or a hub id (owner/name)." if allow_paths else ""
    installed = installed_models()
    missing = [m for m in CATALOGUE if m not in installed]
    absent = f" (also in the catalogue, not installed here: {', '.join(missing)})" if missing else ""
    return UnknownModelError(
        f"Unknown model {name!r}; installed: {', '.join(installed) or 'none'}{absent}.{hint}"
    )


def offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once at import; read it per call so tests and users can
    # set it late.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_failure(name: str, e: BaseException) -> str:
    """Why a hub id did not load, and the next step that fits how HF_HUB_OFFLINE is set."""
    detail = (str(e).splitlines() or [type(e).__name__])[0][:200]
    if offline():
        return (
            f"Could not load {name!r}: HF_HUB_OFFLINE is set, so only the local hub cache is used, and "
            "the repo is not in it. Unset HF_HUB_OFFLINE to download it (needs a connection), or give "
            f"a local checkpoint folder. ({detail})"
        )
    return (
        f"Could not load {name!r} from the Hugging Face hub: it is unreachable or the repo does not "
        "exist. Check the id and the connection, set HF_HUB_OFFLINE=1 to use only the local cache "
        f"(and skip retries), or give a local checkpoint folder. ({detail})"
    )


@dataclass(frozen=True)
class LoadRequest:
    """How to load one member: what load_member was asked, for every loader alike."""

    name: str
    device: str
    dtype: str
    device_map: str | dict[str, Any] | None
    cache_dir: str | os.PathLike[str] | None
    trust_remote_code: bool
    progress: Progress
    compile_decode: bool = False  # HFMember drafts in a static cache, compiled (members/hf/compiled.py)
    quantize: str = "none"  # "int8"/"int4": torch weights quantized (quantize.py); "gguf": llama.cpp
    decode: str = "auto"  # how an HFMember drafts: "graphs" (members/hf/slots.py), "eager", "auto"


@dataclass(frozen=True)
class Loader:
    """One way to name a member. The first loader whose `matches` accepts a name loads it."""

    kind: str  # "catalogue", "server", "folder", "gguf", "hub"
    matches: Callable[[str], bool]
    trust: str  # who may use it: "anyone", "paths" (the operator's own files and hub ids), "servers"
    load: Callable[[LoadRequest], Member]


def is_dir(name: str) -> bool:
    return Path(name).expanduser().is_dir()


def is_gguf(name: str) -> bool:
    path = Path(name).expanduser()
    return path.is_file() and path.suffix == ".gguf"


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def is_server(name: str) -> bool:
    from specfuse.members.remote.member import is_server_spec

    return is_server_spec(name)


def pick_loader(
    name: str, loaders: Sequence[Loader], *, allow_paths: bool = True, allow_servers: bool | None = None
) -> Loader:
    """The first of `loaders` for `name` that its caller may use, or the error that says why `name`
    cannot be a member (loading.check_member_name over its LOADERS)."""
    allow_servers = allow_paths if allow_servers is None else allow_servers
    allowed = {"anyone": True, "paths": allow_paths, "servers": allow_servers}
    for loader in loaders:
        if loader.matches(name):
            if allowed[loader.trust]:
                return loader
            if loader.kind == "server":
                raise UnknownModelError(
                    f"Unknown model {name!r}: only the operator names servers (with start-up flags)."
                )
            raise unknown_model(name, allow_paths=False)
    if allow_paths and (os.sep in name or name.startswith((".", "~"))):
        raise ModelLoadError(f"No checkpoint folder at {name!r}; give an existing folder.")
    raise unknown_model(name, allow_paths=allow_paths)


def _tokenizer_source(
    source: str, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = no_progress
) -> tuple[str | Path, str | None, ModelEntry | None]:
    """Where `source`'s tokenizer is: (a folder or a hub id, the GGUF file in that folder or None,
    its catalogue entry or None). A catalogue name gives its converted folder when cached, else its
    GGUF file (assembled here); else a local folder, a .gguf file or a hub id."""
    entry = CATALOGUE.get(source)
    if entry is not None:
        folder = cached_folder(entry, cache_dir)
        if folder is not None:
            return folder, None, entry
        gguf = assemble_gguf(entry, cache_root(cache_dir) / "gguf", progress)
        return gguf.parent, gguf.name, entry
    if is_dir(source):
        return Path(source).expanduser(), None, None
    if is_gguf(source):
        path = Path(source).expanduser()
        return path.parent, path.name, None
    if is_hub_id(source):
        return source, None, None
    raise UnknownModelError(
        f"Unknown tokenizer {source!r} for a served member; give a catalogue name "
        f"({', '.join(CATALOGUE)}), a local folder, a .gguf file or a hub id with ?tokenizer="
    )


def _catalogue_gguf_tokenizer(folder: Path, gguf_file: str) -> Any:
    """A catalogue model's tokenizer from its GGUF file, in the class AutoTokenizer would pick.

    AutoTokenizer reads the file twice: its tokenizer with transformers' fast metadata reader, then
    the whole file again with gguf-py's reader only to learn the model type, which for Gemma 3's
    262,144-token vocabulary takes about 20 s on two cores (issue 58: most of a cold first minute).
    The file's own architecture names the class here instead, from AutoTokenizer's own table (its
    fallback where the table has none): its header read without the vocabulary (0.1 s), the whole
    file only once. Only for catalogue models, whose tokenizers a test checks against AutoTokenizer's:
    a model type renamed from its architecture (llama files named "mistral", say) could pick another
    class for other files.
    """
    from transformers.integrations.gguf import read_gguf_metadata
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    metadata, _ = read_gguf_metadata(str(folder / gguf_file), ())
    name = TOKENIZER_MAPPING_NAMES.get(metadata.get("general.architecture", "")) or "TokenizersBackend"
    tokenizer_class = tokenizer_class_from_name(name)
    if tokenizer_class is None:  # the tokenizers package missing: AutoTokenizer says why
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
    return tokenizer_class.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)


def load_tokenizer(
    source: str, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = no_progress
) -> tuple[Any, PromptFormat, Any]:
    """A model's tokenizer without its weights: (tokenizer, prompt format, generation eos ids).

    `source`: a catalogue name (its converted folder when cached, else its GGUF file), a local
    folder, a .gguf file, or a hub id.
    """
    from transformers import AutoTokenizer, GenerationConfig

    where, gguf_file, entry = _tokenizer_source(source, cache_dir, progress)
    kwargs: dict[str, Any] = {"local_files_only": offline() if isinstance(where, str) else True}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    try:
        if gguf_file is not None and entry is not None:
            tokenizer = _catalogue_gguf_tokenizer(Path(where), gguf_file)
        else:
            tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError, struct.error) as e:  # struct.error: a truncated GGUF file
        raise ModelLoadError(f"Could not load the tokenizer {source!r}: {e}") from e
    try:
        eos = GenerationConfig.from_pretrained(where, **kwargs).eos_token_id
    except (OSError, ValueError, KeyError, TypeError):
        eos = None  # no generation config: the tokenizer's own end tokens are used
    if entry is not None:
        prompt_format = entry.prompt_format
    else:
        prompt_format = CHAT if getattr(tokenizer, "chat_template", None) else QA_COMPLETION
    return tokenizer, prompt_format, eos


def resolve_quantize(
    quantize: str, name: str, device: str, device_map: str | dict[str, Any] | None = None
) -> str:
    """ "auto": "gguf" for a GGUF model (a catalogue name or a .gguf file) bound for the CPU where
    llama-cpp-python is installed, else "none". Any other value stays as it is. (Not "gguf-draft",
    faster still: its GSM8K score fell 2 points from bf16's, past the 1-point bound;
    docs/benchmarks-log.md.)"""
    if quantize != "auto":
        return quantize
    on_cpu = device_map is None and (device.startswith("cpu") or (device == "auto" and not gpu_count()))
    has_gguf = name in CATALOGUE or is_gguf(name)
    return "gguf" if on_cpu and has_gguf and importlib.util.find_spec("llama_cpp") is not None else "none"
