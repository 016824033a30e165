"""round_png: one round's panels as one 1920×1080 PNG, for a slide. Drawn with Pillow (imported on
first use: it comes with the app's dependencies, gradio's own).

Left: the answer up to round k, each segment tinted in its member's colour, and the round's
candidates with the winner marked; right: the normalized verification matrix as a heatmap with its
values, and the weights over the rounds up to k. The numbers and colours are the HTML handout's
(data.page_data).
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError, SpecfuseError
from ..trace import Trace
from .data import SCALE, page_data, shown_controls
from .i18n import ENGLISH, catalogue
from .i18n import t as say

WIDTH, HEIGHT = 1920, 1080
LEFT = (40, 1060)  # x span of the left column (answer, candidates)
RIGHT = (1110, 1880)  # x span of the right column (matrix, weights)
INK, MUTED, RULE, WON, ACCENT = (17, 17, 17), (85, 85, 85), (200, 200, 200), (255, 244, 194), (214, 39, 40)
ELLIPSIS = "…"  # the one character past ASCII that Pillow's built-in font draws
RGB = tuple[int, int, int]
Piece = tuple[float, str, int]  # (x, text, segment index) on one line of the answer


def hex_rgb(color: str) -> RGB:
    value = int(color.lstrip("#"), 16)
    return (value >> 16) & 255, (value >> 8) & 255, value & 255


def tint(color: RGB, alpha: float) -> RGB:
    """`color` laid over white at `alpha` (0..1)."""
    r, g, b = (round(255 + alpha * (c - 255)) for c in color)
    return r, g, b


def scale_color(t: float) -> RGB:
    """The matrix's colour scale (data.SCALE) at t in 0..1."""
    t = min(1.0, max(0.0, t))
    for (a, low), (b, high) in zip(SCALE, SCALE[1:]):
        if t <= b:
            f = (t - a) / (b - a)
            lo, hi = hex_rgb(low), hex_rgb(high)
            r, g, bl = (round(x + f * (y - x)) for x, y in zip(lo, hi))
            return r, g, bl
    return hex_rgb(SCALE[-1][1])


def readable_on(color: RGB) -> RGB:
    """Black or white, whichever reads better on `color`."""
    r, g, b = color
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str, one_line: bool = False) -> str:
    """Text as it can be drawn: tabs as spaces, line and paragraph separators as line breaks (or, on
    one line, every run of white space as one space), other control characters dropped, directional
    ones written out (data.shown_controls). Each string is drawn by its own call, so a right-to-left
    name is laid out apart from the text beside it: isolated as <bdi> isolates it on a page."""
    text = text.replace("\r\n", "\n").replace("\t", "    ").replace("\u2028", "\n").replace("\u2029", "\n")
    text = shown_controls(_CONTROL.sub("", text))
    return " ".join(text.split()) if one_line else text


class Pen:
    """A Pillow drawing with one font file in every size: Pillow's built-in one (`font` None) or a
    TrueType file."""

    def __init__(self, draw: Any, font: str | os.PathLike[str] | None) -> None:
        from PIL import ImageFont

        self.draw = draw
        self._fonts: dict[int, Any] = {}
        self._load: Callable[[int], Any] = (
            (lambda size: ImageFont.load_default(size=size))
            if font is None
            else (lambda size: ImageFont.truetype(os.fspath(font), size))
        )

    def font(self, size: int) -> Any:
        if size not in self._fonts:
            self._fonts[size] = self._load(size)
        return self._fonts[size]

    def width(self, text: str, size: int) -> float:
        return float(self.font(size).getlength(text))

    def fit(self, text: str, size: int, width: float) -> str:
        """`text` on one line, cut with … to fit `width` pixels."""
        text = clean(text, one_line=True)
        if self.width(text, size) <= width:
            return text
        low, high = 0, len(text)  # the longest prefix that fits with the ellipsis
        while low < high:
            mid = (low + high + 1) // 2
            if self.width(text[:mid] + ELLIPSIS, size) <= width:
                low = mid
            else:
                high = mid - 1
        return text[:low].rstrip() + ELLIPSIS

    def text(
        self, xy: tuple[float, float], text: str, size: int, fill: RGB = INK, anchor: str = "la"
    ) -> None:
        self.draw.text(xy, text, font=self.font(size), fill=fill, anchor=anchor)

    def wrap(self, text: str, size: int, width: float) -> list[str]:
        """`text` broken into lines of at most `width` pixels, at spaces where it can."""
        lines: list[str] = []
        for pieces in wrap_pieces([(clean(text), 0)], self, size, width):
            lines.append("".join(p[1] for p in pieces))
        return lines


def wrap_pieces(segments: Sequence[tuple[str, int]], pen: Pen, size: int, width: float) -> list[list[Piece]]:
    """Segments (text, index) laid out in lines of at most `width` pixels: words stay whole unless a
    word alone is wider than a line; white space at the start of a wrapped line is dropped."""
    lines: list[list[Piece]] = [[]]
    x = 0.0
    for text, index in segments:
        for token in re.findall(r"\n|[^\S\n]+|\S+", text):
            if token == "\n":
                lines.append([])
                x = 0.0
                continue
            w = pen.width(token, size)
            if token.isspace():
                if x > 0:
                    lines[-1].append((x, token, index))
                    x += w
                continue
            if x > 0 and x + w > width:
                lines.append([])
                x = 0.0
            while w > width:  # one word wider than the line: cut it where it has to be
                cut = max(1, len(pen.fit(token, size, width).rstrip(ELLIPSIS)))
                lines[-1].append((x, token[:cut], index))
                lines.append([])
                token = token[cut:]
                w, x = pen.width(token, size), 0.0
            lines[-1].append((x, token, index))
            x += w
    return lines


def round_png(
    trace: Trace, k: int, *, font: str | os.PathLike[str] | None = None, lang: str = ENGLISH
) -> bytes:
    """Round k (from 1) of `trace` as one 1920×1080 PNG, for a slide.

    It shows the answer up to round k (each segment tinted in its member's colour, round k's
    strongest), round k's candidates (member, text on one line, tokens, normalized score) with the
    winner marked WON, the normalized verification matrix as a heatmap with its values printed (a
    round with a lone draft, or drafts that agreed, was not verified: it says so in words instead),
    and the weights over the rounds up to k with the exits marked ✕.

    Text is drawn with Pillow's built-in font, ImageFont.load_default(size=...), which covers
    ASCII and little else: a character it lacks (accented letters, Chinese, emoji, ✓) is drawn as an
    empty box, so the layout holds but that text cannot be read. `font`, a TrueType or OpenType file
    (a path, or a name Pillow finds in the system's font folders, such as "DejaVuSans.ttf"), draws
    with that font instead. An answer too long for its box shows its end. Raises ConfigError for a
    k outside the trace and SpecfuseError where Pillow is not installed. `lang`: the slide's
    language (specfuse.handout.i18n; Chinese needs a `font` that draws it).
    """
    try:
        from PIL import Image, ImageDraw
    except ImportError as e:
        raise SpecfuseError("round_png needs Pillow: pip install pillow (the app's gradio brings it)") from e
    n = len(trace.rounds)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        held = f"it has rounds 1 to {n}" if n else "it has no rounds"
        raise ConfigError(f"round {k!r} is not in this trace: {held}")
    data = page_data(trace)
    data["lang"] = lang if catalogue(lang) is not None else ENGLISH  # an unknown language fails here
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    try:
        pen = Pen(ImageDraw.Draw(image), font)
        pen.font(24)
    except OSError as e:
        raise ConfigError(f"cannot read the font {str(font)!r}: {e}") from e
    current = data["rounds"][k - 1]
    _header(pen, data, k)
    _answer(pen, data, k, top=140, bottom=615)
    _candidates(pen, data, current, top=640, bottom=1050)
    _matrix(pen, data, current, top=140, bottom=600)
    _weights(pen, data, k, top=625, bottom=1050)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _color(data: dict[str, Any], member: str) -> RGB:
    return hex_rgb(data["colors"].get(member, data["other"]))


def _header(pen: Pen, data: dict[str, Any], k: int) -> None:
    counter = say("round {k} of {n}", data["lang"], k=k, n=len(data["rounds"]))
    pen.text((RIGHT[1], 24), counter, 40, anchor="ra")
    room = RIGHT[1] - LEFT[0] - pen.width(counter, 40) - 60
    title = data["title"]
    if title.startswith("SpecFuse run"):
        title = say("SpecFuse run", data["lang"]) + title[len("SpecFuse run") :]
    pen.text((LEFT[0], 24), pen.fit(title, 36, room), 36)
    x = float(LEFT[0])
    for member in data["members"]:
        name = pen.fit(member, 24, 320)
        if x + 34 + pen.width(name, 24) > RIGHT[1]:
            pen.text((x, 82), ELLIPSIS, 24, MUTED)
            break
        pen.draw.rectangle((x, 84, x + 24, 108), fill=_color(data, member))
        pen.text((x + 32, 82), name, 24)
        x += 34 + pen.width(name, 24) + 36
    pen.draw.line((LEFT[0], 124, RIGHT[1], 124), fill=RULE, width=2)


def _answer(pen: Pen, data: dict[str, Any], k: int, top: int, bottom: int) -> None:
    rounds = data["rounds"]
    lang = data["lang"]
    reason = say(data["stop"], lang) if data["stop"] else say("cancelled", lang)
    stopped = say(" (the run stopped here: {reason})", lang, reason=reason) if k == len(rounds) else ""
    said = say("Answer up to round {k}{stopped}", lang, k=k, stopped=stopped)
    pen.text((LEFT[0], top), pen.fit(said, 26, LEFT[1] - LEFT[0]), 26, MUTED)
    size, line_h, pad = 30, 44, 12
    box = (LEFT[0], top + 40, LEFT[1], bottom)
    pen.draw.rectangle(box, outline=RULE, width=2)
    segments = [(clean(r["candidates"][r["chosen"]]["text"]), i) for i, r in enumerate(rounds[:k])]
    lines = wrap_pieces(segments, pen, size, box[2] - box[0] - 2 * pad)
    room = (box[3] - box[1] - 2 * pad) // line_h
    if len(lines) > room:  # the end of the answer is what round k added: keep it in view
        lines = [[(0.0, ELLIPSIS, -1)], *lines[len(lines) - room + 1 :]]
    y = box[1] + pad
    for line in lines:
        for x, text, index in line:
            left = box[0] + pad + x
            if index >= 0:
                r = rounds[index]
                color = _color(data, r["candidates"][r["chosen"]]["member"])
                now = index == k - 1
                right = left + pen.width(text, size)
                pen.draw.rectangle((left, y, right, y + line_h - 4), fill=tint(color, 0.55 if now else 0.25))
                pen.draw.rectangle((left, y + line_h - 8, right, y + line_h - 4), fill=INK if now else color)
            pen.text((left, y + 4), text, size)
        y += line_h


def _candidates(pen: Pen, data: dict[str, Any], r: dict[str, Any], top: int, bottom: int) -> None:
    pen.text((LEFT[0], top), say("Candidates of round {k}", data["lang"], k=r["k"]), 26, MUTED)
    cands = r["candidates"]
    row_h = min(48, (bottom - top - 84) // max(1, len(cands)))
    size = max(12, min(24, row_h - 16))
    member_x, text_x, tokens_x, score_x, mark_x = LEFT[0] + 8, LEFT[0] + 250, 820, 930, LEFT[1] - 8
    y = top + 40
    for x, label, anchor in (
        (member_x, "member", "la"),
        (text_x, "candidate", "la"),
        (tokens_x, "tokens", "ra"),
        (score_x, "score", "ra"),
    ):
        pen.text((x, y), say(label, data["lang"]), 22, MUTED, anchor)
    y += 36
    pen.draw.line((LEFT[0], y, LEFT[1], y), fill=RULE, width=2)
    for j, c in enumerate(cands):
        won = j == r["chosen"]
        if won:
            pen.draw.rectangle((LEFT[0], y + 2, LEFT[1], y + row_h - 2), fill=WON, outline=ACCENT, width=3)
        middle = y + row_h / 2
        pen.draw.rectangle(
            (member_x, middle - 10, member_x + 20, middle + 10), fill=_color(data, c["member"])
        )
        pen.text(
            (member_x + 30, middle), pen.fit(c["member"], size, text_x - member_x - 44), size, anchor="lm"
        )
        text = c["text"] if c["text"] else "(empty)"
        pen.text((text_x, middle), pen.fit(text, size, tokens_x - text_x - 90), size, anchor="lm")
        pen.text((tokens_x, middle), str(c["tokens"]), size, anchor="rm")
        score = "-" if c["score"] is None or not r["verified"] else f"{c['score']:.3f}"
        pen.text((score_x, middle), score, size, anchor="rm")
        mark = (
            say("WON", data["lang"])
            if won
            else (say("not eligible", data["lang"]) if not c["eligible"] else "")
        )
        pen.text((mark_x, middle), mark, size if won else max(12, size - 6), ACCENT if won else MUTED, "rm")
        y += row_h


def _matrix(pen: Pen, data: dict[str, Any], r: dict[str, Any], top: int, bottom: int) -> None:
    lang = data["lang"]
    pen.text(
        (RIGHT[0], top),
        say("Verification matrix of round {k} (verifier x candidate)", lang, k=r["k"]),
        26,
        MUTED,
    )
    cands, verifiers = r["candidates"], r["verifiers"]
    winner = cands[r["chosen"]]["member"]
    if not r["verified"] or not verifiers:
        lone = say("a lone draft (only {member} drafted)", lang, member=winner)
        why = lone if len(cands) == 1 else say("the drafts agreed", lang)
        words = say(
            "Round {k} was not verified: {why}, so {member}'s segment was taken without scoring. There is no "
            "matrix for this round.",
            lang,
            k=r["k"],
            why=why,
            member=winner,
        )
        for i, line in enumerate(pen.wrap(words, 32, RIGHT[1] - RIGHT[0])[:8]):
            pen.text((RIGHT[0], top + 70 + 46 * i), line, 32)
        return
    label_w = 200
    cell_w = min(160.0, (RIGHT[1] - RIGHT[0] - label_w) / len(cands))
    cell_h = min(64.0, (bottom - top - 130) / len(verifiers))
    size = int(max(12, min(26, cell_h * 0.45, cell_w / 3.2)))
    values = [v for row in r["matrix"] for v in row if v is not None]
    lo, hi = (0.0, 1.0) if data["fixed"] or not values else (min(values), max(values))
    x0, y0 = RIGHT[0] + label_w, top + 90
    for j, c in enumerate(cands):
        pen.text((x0 + (j + 0.5) * cell_w, y0 - 8), pen.fit(c["member"], 20, cell_w - 6), 20, anchor="md")
    for i, verifier in enumerate(verifiers):
        y = y0 + i * cell_h
        pen.text((x0 - 10, y + cell_h / 2), pen.fit(verifier, 20, label_w - 14), 20, anchor="rm")
        for j, value in enumerate(r["matrix"][i]):
            x = x0 + j * cell_w
            fill = scale_color((value - lo) / (hi - lo) if hi > lo else 0.5) if value is not None else RULE
            pen.draw.rectangle((x, y, x + cell_w - 2, y + cell_h - 2), fill=fill)
            shown = "-" if value is None else f"{value:.2f}"
            pen.text((x + cell_w / 2, y + cell_h / 2), shown, size, readable_on(fill), "mm")
    j = r["chosen"]
    frame = (x0 + j * cell_w - 3, y0 - 36, x0 + (j + 1) * cell_w + 1, y0 + len(verifiers) * cell_h + 1)
    pen.draw.rectangle(frame, outline=ACCENT, width=4)
    pen.text(((frame[0] + frame[2]) / 2, frame[1] - 4), say("WON", lang), 20, ACCENT, "md")
    caption = (
        say(
            "normalized scores ({normalization}): each verifier's row sums to 1; colour scale 0 to 1",
            lang,
            normalization=data["normalization"],
        )
        if data["fixed"]
        else say("raw scores (normalization none), coloured from this round's lowest to its highest", lang)
    )
    pen.text((RIGHT[0], frame[3] + 14), pen.fit(caption, 20, RIGHT[1] - RIGHT[0]), 20, MUTED)


def _weights(pen: Pen, data: dict[str, Any], k: int, top: int, bottom: int) -> None:
    pen.text((RIGHT[0], top), say("Weights over the rounds, up to round {k}", data["lang"], k=k), 26, MUTED)
    rounds, members = data["rounds"], data["members"]
    n = len(rounds)
    history = [data["start"], *(r["weights"] for r in rounds)]
    highest = max((w for ws in history for w in ws if w is not None), default=0.0)
    ymax = math.ceil(highest * 10) / 10 if highest > 0 else 1.0  # up to the next tenth
    left, right, chart_top, chart_bottom = RIGHT[0] + 70, RIGHT[1] - 10, top + 50, bottom - 62

    def x(round_k: float) -> float:
        return left + (right - left) * round_k / max(1, n)

    def y(w: float | None) -> float:
        return chart_bottom - (chart_bottom - chart_top) * (w or 0.0) / ymax

    for t in (0.0, ymax / 2, ymax):
        pen.draw.line((left, y(t), right, y(t)), fill=(235, 235, 235), width=1)
        pen.text((left - 10, y(t)), f"{t:.2f}", 20, MUTED, "rm")
    pen.draw.line((left, chart_top, left, chart_bottom), fill=MUTED, width=2)
    pen.draw.line((left, chart_bottom, right, chart_bottom), fill=MUTED, width=2)
    step = max(1, math.ceil(n / 10))
    for t in range(0, n + 1, step):
        pen.text((x(t), chart_bottom + 8), str(t), 20, MUTED, "ma")
    pen.text(
        ((left + right) / 2, bottom), say("round (0 = the starting weights)", data["lang"]), 20, MUTED, "md"
    )
    pen.draw.line((x(k), chart_top, x(k), chart_bottom), fill=INK, width=2)
    for i, member in enumerate(members):
        points = [(x(t), y(history[t][i])) for t in range(k + 1)]
        pen.draw.line(points, fill=_color(data, member), width=5, joint="curve")
        cx, cy = points[-1]
        pen.draw.ellipse((cx - 7, cy - 7, cx + 7, cy + 7), fill=_color(data, member), outline=INK)
    for r in rounds[:k]:
        for e in r["exits"]:
            cx, cy, d = x(r["k"]), y(r["weights"][members.index(e["member"])]), 9
            for a, b in (((cx - d, cy - d), (cx + d, cy + d)), ((cx - d, cy + d), (cx + d, cy - d))):
                pen.draw.line((a, b), fill=_color(data, e["member"]), width=5)
