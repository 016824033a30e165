"""The in-process llama.cpp back end: LlamaCppMember, a GGUF file in llama.cpp in this process.

member.py loads the library and the model and answers the Member protocol; decode.py its KV
cache's slots, candidate sequences and decode calls (a mixin it inherits). The folder's public name
is LlamaCppMember.
"""

from .member import LlamaCppMember

__all__ = ["LlamaCppMember"]
