"""Members: the models of an ensemble behind one small interface (protocol.py).

protocol.py declares what a member is and may do (torch-free); hf.py is a transformers model in this
process, llamacpp.py a GGUF file in llama.cpp in this process (llamacpp_decode.py its KV cache's slots
and candidate sequences and its decode calls, a mixin it inherits), remote.py a model on an inference
server (remote_engines.py the adapter for each engine's JSON), process.py any member in a worker
process of its own; drafting.py holds the token rules all of them share, templates.py how a
tokenizer renders a conversation (its chat template; a message's text never a control token).
HFMember spans several modules: hf.py its model, contexts and caches (start, accept), hf_state.py a
request's state, hf_drafting.py and hf_verifying.py its drafting and its verify pass (mixins it
inherits), scoring.py the tensor work of that pass, prefill.py its reading of several prompts at
once, compiled.py its opt-in static-cache compiled drafting (GPU); workers.py runs several members'
work at the same time. Nothing here imports the others on import.
"""
