"""Models: which ones we know (the catalogue), where their files come from (the converted-model
cache), where they run (devices and dtypes), how much each is trusted before round 1 (trust.py),
their weights quantized on the CPU (quantize.py; the --quantize flag without torch:
quantize_options.py), what a name names and who may use it (names.py), and the one path that turns
names into members (loading.py)."""
