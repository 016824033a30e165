"""Members: the models of an ensemble behind one small interface (protocol.py).

protocol.py declares what a member is and may do (torch-free); hf.py is a transformers model in this
process, llamacpp.py a GGUF file in llama.cpp in this process, remote.py a model on an inference server,
process.py any member in a worker process of its own; drafting.py holds the token rules all of them
share, scoring.py the tensor work of HFMember's verify pass,
prefill.py HFMember's reading of several prompts at once, compiled.py its opt-in static-cache compiled
drafting (GPU); workers.py runs several members' work at
the same time. Nothing here imports the others on import.
"""
