"""The members: Hugging Face, llama.cpp and served back ends, slots, processes, workers."""
