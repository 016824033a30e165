"""Models: which ones we know (the catalogue), where their files come from (the converted-model
cache), where they run (devices and dtypes), and the one path that turns names into members."""
