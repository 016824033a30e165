"""The in-process transformers back end: HFMember, one Hugging Face causal LM in this process.

member.py holds the model, its contexts and caches (start, accept); state.py a request's state;
drafting.py and verifying.py its drafting and its verify pass (mixins HFMember inherits); scoring.py
the tensor work of that pass; prefill.py its reading of several prompts at once; compiled.py its
opt-in static-cache compiled drafting, slots.py and slot_verify.py its drafting and verification on
static KV slots (CUDA graphs on a GPU). The folder's public name is HFMember (docs/api.md).
"""

from .member import HFMember

__all__ = ["HFMember"]
