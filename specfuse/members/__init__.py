"""Members: the models of an ensemble behind one small interface (protocol.py).

A folder per back end, each exporting its member class: hf/ a transformers model in this process
(HFMember), llamacpp/ a GGUF file in llama.cpp in this process (LlamaCppMember), remote/ a model on
an inference server (RemoteMember). The shared pieces stay here: protocol.py declares what a member
is and may do (torch-free), among it sharing(), how a back end lets a model listed twice share its
weights; drafting.py holds the token rules all back ends share and TokenState, the part of a
request's state they keep alike; templates.py how a tokenizer renders a conversation (its chat
template; a message's text never a control token); split.py one model drafting in one back end and
scoring in another; process.py any member in a worker process of its own; workers.py runs several
members' work at the same time; profiling.py tallies where time goes; cpu.py what this machine's
CPU is. No back end imports another (tests/project/test_layout.py); nothing here imports them on import.
"""
