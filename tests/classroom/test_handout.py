"""Take a run home (specfuse.handout): the offline HTML page names no address and embeds a hostile
trace as inert data, 60 rounds stay under 3 MB, round_png draws 1920×1080 slides, and `specfuse
export` writes both. The page in a real browser: tests/browser/test_handout.py."""

from __future__ import annotations

import dataclasses
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from specfuse import ConfigError, dump_trace, load_trace, save_trace
from specfuse.handout import round_png, trace_html
from specfuse.handout.html import CSP, asset

from ..helpers_cli import run_cli
from ..helpers_handout import (
    DATA,
    HOSTILE_DRAFTS,
    HOSTILE_MEMBERS,
    HOSTILE_PROMPT,
    XSS_IMG,
    XSS_SCRIPT,
    hostile_trace,
    long_trace,
    page_json,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [ROOT / "assets" / "example-trace.json", ROOT / "assets" / "example-gsm8k-trace.json"]
# Anything that could make a page fetch: attributes that load, CSS that loads, addresses, and the
# script calls that send requests.
NETWORK = re.compile(
    r"\b(?:src|href|action|srcset|poster|formaction)\s*=|url\s*\(|@import|\b(?:https?|ftp|wss?):|"
    r"fetch\s*\(|XMLHttpRequest|WebSocket|EventSource|sendBeacon|import\s*\(|<(?:link|img|iframe|"
    r"object|embed|base|form|audio|video|source)\b",
    re.I,
)


@pytest.fixture(scope="module")
def hostile():
    return hostile_trace()


class Tags(HTMLParser):
    """Every start tag and attribute name of a page, as a browser's parser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes |= {name for name, _ in attrs}


def tags_of(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    parser.close()
    return parser


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_page_names_no_address_and_its_policy_forbids_every_load(path):
    page = trace_html(load_trace(path))
    assert NETWORK.findall(page) == []
    head = page[: page.index("</head>")]
    policy = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
    assert policy in head and head.index(policy) < head.index("<style>")  # before anything it governs
    assert CSP == "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
    # The control: the pattern does find the loads it is there to find.
    control = "<img src=a.png> <link href=//cdn.example/x.css> url(x) https://x @import"
    assert NETWORK.findall(control) == ["<img", "src=", "<link", "href=", "url(", "https:", "@import"]


def test_the_player_inserts_text_only_and_cannot_end_its_own_element():
    js, css, template = asset("player.js"), asset("player.css"), asset("page.html")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("):
        assert sink not in js, sink
    assert "</script" not in js.lower() and "</style" not in css.lower() and "<!--" not in js
    assert NETWORK.findall(js + css + template) == []


def test_the_page_holds_the_run_the_panels_need(hostile):
    data = page_json(trace_html(hostile))
    assert data["members"] == list(HOSTILE_MEMBERS) and len(data["rounds"]) == len(hostile.rounds)
    answer = "".join(r["candidates"][r["chosen"]]["text"] for r in data["rounds"])
    assert answer == hostile.rounds[-1].text  # the answer up to round k is the first k segments
    first, last = data["rounds"][0], data["rounds"][-1]
    assert [c["member"] for c in first["candidates"]] == list(HOSTILE_MEMBERS)
    assert first["matrix"] == [[round(s, 4) for s in row] for row in hostile.rounds[0].scores]
    assert first["verifiers"] == list(hostile.rounds[0].verifiers) and first["verified"]
    assert not last["verified"] and last["matrix"] == [] and len(last["candidates"]) == 1
    exits = [(e["member"], e["k"]) for r in data["rounds"] for e in r["exits"]]
    assert exits == [(HOSTILE_MEMBERS[1], 6), (HOSTILE_MEMBERS[2], 7)]
    assert data["start"] == [round(w, 4) for w in hostile.rounds[0].weights_before]
    assert (
        data["title"]
        == "SpecFuse run: Say </script><script>alert(1)</script> and <img src=x onerror=alert(1)>"
    )


def test_sixty_rounds_of_eight_members_stay_under_3_mb():
    trace = long_trace(rounds=60, members=8, chars=1000)
    assert len(trace.rounds) == 60 and all(len(r.candidates) == 8 for r in trace.rounds)
    page = trace_html(trace).encode("utf-8")
    assert len(page) <= 3_000_000, f"{len(page):,} bytes"
    assert len(page) < len(dump_trace(trace).encode("utf-8")) / 3  # the repeated answer is not kept
    assert len(page_json(page.decode())["rounds"]) == 60


def test_a_hostile_trace_is_embedded_as_data_that_decodes_to_its_own_strings(hostile):
    page = trace_html(hostile, title=XSS_SCRIPT)
    data = page_json(page)
    assert data["prompt"] == HOSTILE_PROMPT and data["title"] == XSS_SCRIPT
    assert data["members"] == list(HOSTILE_MEMBERS)
    texts = {c["text"] for r in data["rounds"] for c in r["candidates"]}
    assert texts == set(HOSTILE_DRAFTS)
    # Nothing from the data is markup: the hostile page parses to the very tags a plain one does.
    plain = trace_html(load_trace(EXAMPLES[0]))
    assert tags_of(page).tags == tags_of(plain).tags
    assert tags_of(page).attributes == tags_of(plain).attributes
    assert page.lower().count("<script") == 2 and page.lower().count("</script") == 2
    for raw in (XSS_SCRIPT, XSS_IMG, "<b>bold", "<!--"):
        assert raw not in page, raw
    (embedded,) = DATA.findall(page)
    assert not set("<>&\u2028\u2029") & set(embedded)  # each one a \uXXXX escape in the JSON
    assert "&lt;/script&gt;" in page  # the title and the no-script copy are escaped HTML


def test_a_trace_without_rounds_is_refused_with_a_reason(hostile):
    empty = dataclasses.replace(hostile, rounds=())
    with pytest.raises(ConfigError, match="no rounds"):
        trace_html(empty)
    with pytest.raises(ConfigError, match="no rounds"):
        round_png(empty, 1)


def test_a_lone_surrogate_in_a_trace_is_escaped_not_an_encoding_error(hostile):
    trace = dataclasses.replace(hostile, prompt="half a pair: \ud83d end")
    page = trace_html(trace, title="\udc00 title")
    page.encode("utf-8")  # writable as UTF-8
    assert page_json(page)["prompt"] == "half a pair: \ud83d end"


def png(content: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(content))
    assert image.format == "PNG" and image.size == (1920, 1080)
    return image.convert("RGB")


def colourful(image: Image.Image, box: tuple[int, int, int, int]) -> int:
    """Pixels in `box` that are not a shade of grey (the heatmap's cells, not text on white)."""
    return sum(n for n, (r, g, b) in image.crop(box).getcolors(1 << 20) if max(r, g, b) - min(r, g, b) > 40)


MATRIX_AREA = (1110, 200, 1880, 600)  # png.py's right column, above the weights


def test_round_png_is_a_1920x1080_slide_with_a_heatmap_or_words(hostile):
    verified = png(round_png(load_trace(EXAMPLES[1]), 1))
    assert colourful(verified, MATRIX_AREA) > 10_000  # the heatmap's cells
    lone = png(round_png(hostile, len(hostile.rounds)))  # a lone draft: no matrix, words instead
    assert colourful(lone, MATRIX_AREA) == 0
    words = sum(n for n, rgb in lone.crop(MATRIX_AREA).getcolors(1 << 20) if max(rgb) < 100)
    assert words > 2_000  # dark text where the grid would be
    for k in (0, len(hostile.rounds) + 1):
        with pytest.raises(ConfigError, match="not in this trace"):
            round_png(hostile, k)


def test_round_png_draws_text_its_font_lacks_and_takes_another_font(hostile):
    from PIL import ImageFont

    r = hostile.rounds[0]
    odd = dataclasses.replace(
        r, candidates=(dataclasses.replace(r.candidates[0], text="写一首诗 ✓ é\t\x00"),)
    )
    odd = dataclasses.replace(odd, text=odd.candidates[0].text, chosen=0)
    png(round_png(dataclasses.replace(hostile, rounds=(odd,)), 1))  # boxes for what the font lacks
    try:
        ImageFont.truetype("DejaVuSans.ttf", 10)
    except OSError:
        pytest.skip("no DejaVuSans.ttf on this machine")
    with_font = round_png(hostile, 1, font="DejaVuSans.ttf")
    assert with_font != round_png(hostile, 1)
    with pytest.raises(ConfigError, match="cannot read the font"):
        round_png(hostile, 1, font="/nonexistent/font.ttf")


def test_export_writes_the_page_and_a_slide(hostile, tmp_path):
    trace = save_trace(hostile, tmp_path / "run.json")
    page, slide = tmp_path / "run.html", tmp_path / "round2.png"
    code, out, err = run_cli("export", str(trace), "--html", str(page), "--png", str(slide), "--round", "2")
    assert code == 0, err
    assert page.read_text(encoding="utf-8") == trace_html(load_trace(trace))
    assert slide.read_bytes() == round_png(load_trace(trace), 2)
    assert f"wrote {page}" in out and f"wrote {slide}" in out and "round 2 of 8" in out
    code, out, err = run_cli("export", str(trace), "--png", str(tmp_path / "last.png"))
    assert code == 0 and "round 8 of 8" in out  # the last round by default


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{}", 'not a specfuse trace (expected "schema": "specfuse.trace")'),
        ("not json", "not a JSON document"),
        (None, "cannot read trace"),
    ],
)
def test_export_of_a_bad_trace_exits_2_with_the_loaders_reason(tmp_path, content, reason):
    trace = tmp_path / "bad.json"
    if content is not None:
        trace.write_text(content, encoding="utf-8")
    code, out, err = run_cli("export", str(trace), "--html", str(tmp_path / "out.html"))
    assert code == 2 and err.startswith("specfuse export: error: ") and reason in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out.html").exists()


def test_export_refuses_a_round_or_a_place_it_cannot_use_and_writes_nothing(hostile, tmp_path):
    trace = save_trace(hostile, tmp_path / "run.json")
    page = tmp_path / "run.html"
    code, _, err = run_cli(
        "export", str(trace), "--html", str(page), "--png", str(tmp_path / "x.png"), "--round", "9"
    )
    assert code == 2 and "--round 9: the trace has rounds 1 to 8" in err
    assert not page.exists()
    code, _, err = run_cli("export", str(trace), "--html", str(tmp_path / "no" / "run.html"))
    assert code == 2 and "does not exist" in err
    for argv in ([str(trace)], [str(trace), "--html", str(page), "--round", "2"]):
        with pytest.raises(SystemExit) as exit_:
            run_cli("export", *argv)
        assert exit_.value.code == 2
    assert not page.exists()


def test_export_help_says_what_it_writes(capsys):
    with pytest.raises(SystemExit):
        run_cli("export", "--help")
    text = capsys.readouterr().out
    assert text.startswith("usage: specfuse export") and "--html OUT.html" in text and "--round K" in text
    assert "1920x1080" in " ".join(text.split()) and "Exit status 2 means bad input" in " ".join(text.split())
