"""The in-process llama.cpp back end: LlamaCppMember, a GGUF file in llama.cpp in this process.

member.py makes the context and answers the Member protocol; library.py loads the library and a
GGUF file's weights; decode.py holds its KV cache's slots, candidate sequences and decode calls and
verifying.py its verify pass (mixins it inherits). The folder's public name is LlamaCppMember.
"""

from .member import LlamaCppMember

__all__ = ["LlamaCppMember"]
