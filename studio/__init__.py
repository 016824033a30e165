"""SpecFuse Studio, the Gradio app as a small package of views over the Round stream.

views (Rounds → one component value each) · settings (the form from EnsembleConfig's metadata) ·
panels (components) · request (one Run as the page sent it) · handlers ({component: value} updates;
what_if, its branch, what_if_views its values; updates, their parts) · loading (shared members) ·
layout (build_demo) · the classroom: gallery (lessons), explain (what each panel shows, the
projector view), room (a class session: the room votes on phones). No torch at import and no
arithmetic on scores: specfuse.report has the numbers.
"""

from .handlers import Studio
from .layout import build_demo
from .loading import DEVICES, SharedLoader
from .updates import write_trace

__all__ = ["DEVICES", "SharedLoader", "Studio", "build_demo", "write_trace"]
