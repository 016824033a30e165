"""The files the app offers for download (traces, handouts, round PNGs): one folder per app, a
bounded number of files in it; and the font a round's PNG is drawn with.

Every finished run and branch is offered as a trace file. Each used to get a temp folder of its
own that nothing deleted, so a long-running server's disk grew with every run (issue 24, item 14).
Here a session's new file replaces its previous one of the same kind (run or branch), and past
`limit` files the least recently written goes. Gradio serves its own copy from its cache (which
build_demo bounds with delete_cache), so deleting a file here never breaks a page already showing
it. Knows nothing about Gradio.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

from specfuse import Trace, dump_trace
from specfuse.prompts import prompt_text

LIMIT = 256  # files at most: a few per session that is still open


class TraceFiles:
    """Trace files in one folder, at most one per (session, kind) and `limit` in all."""

    def __init__(self, limit: int = LIMIT, folder: str | Path | None = None) -> None:
        self.limit = limit
        self._folder = Path(folder) if folder is not None else None
        self._files: OrderedDict[tuple[str, str], Path] = OrderedDict()
        self._lock = threading.Lock()
        self._count = 0

    @property
    def folder(self) -> Path:
        if self._folder is None:  # made on first use: building the app writes nothing
            self._folder = Path(tempfile.mkdtemp(prefix="specfuse-traces-"))
        return self._folder

    def write(self, trace: Trace, session: str = "", kind: str = "run") -> str:
        """The trace as a JSON file for the download button; the session's previous one goes."""
        return self.write_file(dump_trace(trace), session, kind, "json")

    def write_file(
        self, content: str | bytes, session: str = "", kind: str = "run", suffix: str = "json"
    ) -> str:
        """Any download (a handout's HTML, a round's PNG) the same way: one per session and kind."""
        data = content.encode("utf-8") if isinstance(content, str) else content
        with self._lock:
            self._count += 1
            tag = re.sub(r"[^A-Za-z0-9]", "", session)[:12] or "api"
            name = f"specfuse-{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{tag}-{self._count}.{suffix}"
            path = self.folder / name
            path.write_bytes(data)
            old = self._files.pop((session, kind), None)
            self._files[(session, kind)] = path
            gone = [old] if old is not None else []
            while len(self._files) > self.limit:
                gone.append(self._files.popitem(last=False)[1])
        for file in gone:
            file.unlink(missing_ok=True)
        return str(path)

    def files(self) -> list[Path]:
        with self._lock:
            return list(self._files.values())

    def close(self) -> None:
        """Delete the folder and every file in it (the app is closing)."""
        with self._lock:
            self._files.clear()
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)


# Fonts that draw more than ASCII (Pillow's built-in one draws other characters as empty boxes),
# tried in order where the system has them: Latin, Greek and symbols; then Chinese, Japanese, Korean.
FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)
CJK_FONTS = (
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
)
CJK = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")


def slide_font(trace: Trace, cjk: bool = False) -> str | None:
    """A font on this system that draws the trace's text (a CJK one when it holds CJK, or `cjk`: a
    slide in Chinese), or None."""
    texts = [prompt_text(trace.prompt), *(c.text for r in trace.rounds for c in r.candidates)]
    wanted = CJK_FONTS if cjk or any(CJK.search(t) for t in texts) else FONTS
    return next((f for f in wanted if Path(f).is_file()), None)
