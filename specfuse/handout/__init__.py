"""Take a run home: a trace as one offline HTML page to step through, or one round as a PNG slide.

`trace_html(trace)` (html.py) is one self-contained file that loads nothing; `round_png(trace, k)`
(png.py) draws round k's panels with Pillow; data.py is what both show of a run; cli.py is
`specfuse export`. The page's template, stylesheet and player ship beside them (page.html,
player.css, player.js).
"""

from .html import trace_html
from .png import round_png

__all__ = ["round_png", "trace_html"]
