"""The served back end: RemoteMember, a model on an inference server (SGLang, vLLM, llama-server).

member.py parses a server spec and answers the Member protocol over HTTP; engines.py adapts each
engine's JSON; transport.py is the HTTP itself (deadlines, retries, size caps, proxies). The
folder's public name is RemoteMember (docs/api.md, docs/remote.md).
"""

from .member import RemoteMember

__all__ = ["RemoteMember"]
