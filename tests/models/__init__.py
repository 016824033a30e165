"""The models: the catalogue, loading, caches, devices, quantization, trust, preparation."""
