"""SpecFuse Studio, the Gradio app: watch several members answer one prompt together, round by round.

A thin view over Ensemble.stream(): pure functions turn Rounds into one component value each, and
build_demo() wires them. No torch and no score arithmetic here (specfuse.report has the numbers).
"""

from __future__ import annotations

import argparse
import html
import os
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from specfuse import (
    ConfigError,
    Ensemble,
    EnsembleConfig,
    ModelLoadError,
    Round,
    SpecfuseError,
    Trace,
    TraceError,
    UnknownModelError,
    answer_spans,
    dump_trace,
    parse_trace,
    report,
)
from specfuse.config import NORMALIZATIONS, SCORE_MODES
from specfuse.engine import check_prompt
from specfuse.trace import MAX_TRACE_BYTES

if TYPE_CHECKING:  # members.py brings torch; the app needs it only once models load
    from specfuse.members import Member

try:  # On a Hugging Face ZeroGPU Space this grants a GPU per call; elsewhere it changes nothing.
    import spaces

    gpu = spaces.GPU(duration=300)
except ImportError:

    def gpu(fn: Callable) -> Callable:
        return fn


ASSETS = Path(__file__).resolve().parent / "assets"
Loader = Callable[[str, str, Callable[[float, str], None]], "Member"]  # (name, device, progress) → member
DevicePlan = Callable[[int, str], list[str]]  # (members, device setting) → one device each

# One colour per member, in ensemble order (Plotly's default qualitative palette).
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880")
DEVICES = ("auto", "cpu", "cuda", "per-gpu")
NORMALIZED, RAW = "normalized ŝ", "raw z"
EXAMPLES = [
    ["Explain in two sentences why the sky is blue."],
    ["Write a Python function that returns the n-th Fibonacci number."],
    ["用一句话介绍长城。"],
    [
        "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
        "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
        "per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
    ],
]


# ---- pure views: rounds → one component value each ---------------------------------------------


def member_colors(members: Sequence[str]) -> dict[str, str]:
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(members)}


def answer_value(rounds: Sequence[Round]) -> list[tuple[str, str]]:
    """The answer as (text, member) spans for HighlightedText: text, never HTML."""
    return answer_spans(rounds)


def status_markdown(rounds: Sequence[Round], note: str = "") -> str:
    """One line: round, tokens, tokens/s, first-segment latency, calls saved by exit, why it stopped."""
    if not rounds:
        return html.escape(note) if note else "Pick two or more members, type a prompt and press **Run**."
    s = report.status(rounds)
    parts = [
        f"**Round {s.round}**",
        f"{s.tokens} tokens",
        f"{s.tokens_per_s:.1f} tokens/s",
        f"first segment {s.first_segment_latency_s:.2f} s",
        f"{s.calls_saved} of {s.calls_made + s.calls_saved} model calls saved by exit",
    ]
    if s.stop_reason:
        parts.append(f"stopped: {html.escape(s.stop_reason)}")
    if note:
        parts.append(html.escape(note))
    return " · ".join(parts)


def _table(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Round the floats and blank the NaNs, so the table is readable and JSON-safe."""
    out = df.copy()
    for column in out.columns:
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = out[column].round(digits)
    return out.astype(object).where(out.notna(), "")


def candidates_value(rnd: Round | None) -> pd.DataFrame:
    if rnd is None:
        return pd.DataFrame(columns=report.CANDIDATE_COLUMNS)
    return _table(report.candidates_table(rnd))


def exits_value(rounds: Sequence[Round]) -> pd.DataFrame:
    return _table(report.exit_table(rounds))


def summary_value(rounds: Sequence[Round]) -> pd.DataFrame:
    return _table(report.member_summary(rounds))


def heatmap_figure(rnd: Round | None, normalized: bool = True, fixed_scale: bool = True) -> go.Figure:
    """The verification matrix of one round: verifier (rows) × candidate (columns), chosen column boxed.

    Normalized scores use a fixed 0..1 colour scale, so rounds compare at a glance; raw scores (and
    normalization "none") use their own range.
    """
    fig = go.Figure()
    fig.update_layout(
        height=320, margin=dict(l=10, r=10, t=40, b=10), uirevision="matrix", template="plotly_white"
    )
    if rnd is None:
        return fig.update_layout(title="verification matrix")
    matrix = report.score_matrix(rnd, normalized)
    columns = [f"{m} ✓" if j == rnd.chosen else m for j, m in enumerate(matrix.columns)]
    scale = dict(zmin=0.0, zmax=1.0) if normalized and fixed_scale else {}
    fig.add_trace(
        go.Heatmap(
            z=matrix.to_numpy().tolist(),
            x=columns,
            y=list(matrix.index),
            colorscale="Viridis",
            texttemplate="%{z:.2f}",
            hovertemplate="verifier %{y}<br>candidate %{x}<br>score %{z:.4f}<extra></extra>",
            **scale,
        )
    )
    fig.add_shape(
        type="rect",
        xref="x",
        yref="paper",
        x0=rnd.chosen - 0.5,
        x1=rnd.chosen + 0.5,
        y0=0,
        y1=1,
        line=dict(color="#d62728", width=3),
    )
    kind = "normalized ŝ" if normalized else "raw z"
    fig.update_layout(
        title=f"round {rnd.k}: {kind} (verifier × candidate)",
        xaxis_title="candidate (drafter)",
        yaxis_title="verifier",
        yaxis_autorange="reversed",
    )
    return fig


def weights_figure(rounds: Sequence[Round]) -> go.Figure:
    """One line per member: its weight over the rounds (0 = start), an ✕ where it exited."""
    fig = go.Figure()
    fig.update_layout(
        height=320,
        margin=dict(l=10, r=10, t=40, b=10),
        title="weights",
        xaxis_title="round",
        yaxis_title="weight",
        uirevision="weights",
        template="plotly_white",
    )
    if not rounds:
        return fig
    history = report.weights_history(rounds)
    colors = member_colors(rounds[-1].members)
    for member, rows in history.groupby("member", sort=False):
        fig.add_trace(
            go.Scatter(
                x=rows["round"].tolist(),
                y=rows["weight"].tolist(),
                mode="lines+markers",
                name=str(member),
                line=dict(color=colors[str(member)]),
            )
        )
    exits = report.exit_points(rounds)
    if len(exits):
        fig.add_trace(
            go.Scatter(
                x=exits["round"].tolist(),
                y=exits["weight"].tolist(),
                mode="markers",
                name="exit",
                text=exits["member"].tolist(),
                marker=dict(symbol="x", size=14, color="black"),
                hovertemplate="%{text} exited after round %{x}<extra></extra>",
            )
        )
    return fig


def compare_html(columns: Sequence[tuple[str, str]]) -> str:
    """Answers side by side: (title, answer) per column, every piece escaped (model text is untrusted)."""
    if not columns:
        return ""
    cells = "".join(
        f'<div class="sf-compare-col"><h4>{html.escape(title)}</h4>'
        f'<pre class="sf-answer">{html.escape(text)}</pre></div>'
        for title, text in columns
    )
    return f'<div class="sf-compare">{cells}</div>'


def segment_html(rounds: Sequence[Round], index: int) -> str:
    """What a selected segment of the answer was: its round, its drafter, and the candidates it beat."""
    if not 0 <= index < len(rounds):
        return ""
    rnd = rounds[index]
    rows = "".join(
        f"<tr><td>{html.escape(c.member)}</td><td><code>{html.escape(c.text)}</code></td>"
        f"<td>{rnd.aggregate[j]:.3f}</td><td>{'✓' if j == rnd.chosen else ''}</td></tr>"
        for j, c in enumerate(rnd.candidates)
    )
    return (
        f"<p>Segment {index + 1} was won in <b>round {rnd.k}</b> by <b>{html.escape(rnd.winner.member)}</b> "
        f"(margin {rnd.margin:.3f}).</p>"
        f"<table class='sf-segment'><tr><th>member</th><th>candidate</th><th>score</th><th></th></tr>"
        f"{rows}</table>"
    )


def panels(trace: Trace | None, k: int | None = None, view: str = NORMALIZED, note: str = "") -> tuple:
    """Every round-dependent panel, as of round k (default: the last): the replay is this at k < last.

    Returns values for (answer, status, candidates, matrix, weights, exits, summary).
    """
    rounds: Sequence[Round] = trace.rounds if trace is not None else ()
    if k is not None:
        rounds = rounds[: max(1, int(k))]
    current = rounds[-1] if rounds else None
    fixed = trace is None or trace.config.normalization != "none"
    members = trace.members if trace is not None else ()
    return (
        gr.HighlightedText(value=answer_value(rounds), color_map=member_colors(members)),
        status_markdown(rounds, note),
        candidates_value(current),
        heatmap_figure(current, view == NORMALIZED, fixed),
        weights_figure(rounds),
        exits_value(rounds),
        summary_value(rounds),
    )


def slider_value(trace: Trace | None, k: int | None = None) -> gr.Slider:
    n = len(trace.rounds) if trace is not None else 0
    return gr.Slider(minimum=1, maximum=max(2, n), value=k or max(1, n), step=1, interactive=n > 1)


def make_config(
    segment_len: float,
    max_new_tokens: float,
    temperature: float,
    top_p: float,
    seed: float,
    feedback: bool,
    learning_rate: float,
    exit_: bool,
    exit_threshold: float,
    exit_warmup: float,
    self_scores: bool,
    score: str,
    normalization: str,
) -> EnsembleConfig:
    """The run's settings from the form; EnsembleConfig validates them (ConfigError)."""
    return EnsembleConfig(
        segment_len=_whole(segment_len, "segment length"),
        max_new_tokens=_whole(max_new_tokens, "max new tokens"),
        temperature=temperature,
        top_p=top_p,
        seed=_whole(seed, "seed"),
        feedback=bool(feedback),
        learning_rate=learning_rate,
        exit=bool(exit_),
        exit_threshold=exit_threshold,
        exit_warmup=_whole(exit_warmup, "exit warm-up"),
        self_scores=bool(self_scores),
        score=score,
        normalization=normalization,
    )


def _whole(value: Any, name: str) -> int:
    """A form number that must be a whole number (sliders and number boxes send floats)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    return int(value)


def write_trace(trace: Trace) -> str:
    """The trace as a JSON file in a fresh temp folder, for the download button."""
    folder = tempfile.mkdtemp(prefix="specfuse-trace-")
    path = Path(folder) / f"specfuse-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(dump_trace(trace), encoding="utf-8")
    return str(path)


# ---- loading members once, sharing them across sessions -----------------------------------------


class SharedLoader:
    """Loads each (name, device) once, under a lock, and hands the same member to every session.

    Members are shared, runs are not: every run keeps its own states inside Ensemble.stream().
    """

    def __init__(
        self,
        load: Callable[..., Member] | None = None,
        *,
        allow_paths: bool = False,
        trusted: Sequence[str] = (),
        dtype: str = "auto",
    ) -> None:
        self.load = load  # None: specfuse.catalogue.load_member, imported on first use (it brings torch)
        self.allow_paths = allow_paths
        self.trusted = frozenset(trusted)  # paths or hub ids the operator named on the command line
        self.dtype = dtype
        self._members: dict[tuple[str, str], Member] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        with self._lock:
            key = (name, device)
            if key not in self._members:
                if self.load is None:
                    from specfuse.catalogue import load_member

                    self.load = load_member
                allow = self.allow_paths or name in self.trusted
                self._members[key] = self.load(
                    name,
                    device=device,
                    dtype=self.dtype,
                    allow_paths=allow,
                    allow_servers=name in self.trusted,  # server specs: the operator's only, never typed
                    progress=progress,
                )
            return self._members[key]


def _same_device(n: int, device: str) -> list[str]:
    return [device] * n


# ---- layout and wiring --------------------------------------------------------------------------


def build_demo(
    loader: Loader,
    *,
    choices: Sequence[str] | None = None,
    default_models: Sequence[str] | None = None,
    allow_paths: bool = False,
    device: str = "auto",
    plan_devices: DevicePlan = _same_device,
    concurrency_limit: int | None = 1,
    defaults: dict[str, Any] | None = None,
) -> gr.Blocks:
    """The whole app. `loader(name, device, progress)` returns a (shared) member; nothing loads here."""
    if choices is None or default_models is None:
        from specfuse.catalogue import CATALOGUE, DEFAULT_MEMBERS

        choices = list(CATALOGUE) if choices is None else choices
        default_models = DEFAULT_MEMBERS if default_models is None else default_models
    choices = list(choices)
    d = EnsembleConfig(**(defaults or {}))

    with gr.Blocks(title="SpecFuse Studio") as demo:
        gr.Markdown(
            "# SpecFuse Studio\nSeveral small language models answer together, one segment per round: "
            "each drafts a candidate, all score all, the best weighted candidate is appended."
        )
        trace_state = gr.State(None)
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                models = gr.Dropdown(
                    choices=choices,
                    value=list(default_models),
                    multiselect=True,
                    allow_custom_value=allow_paths,
                    label="Members (two or more)",
                    info="Local folders or hub ids allowed" if allow_paths else None,
                    elem_id="models",
                )
                prompt = gr.Textbox(label="Prompt", lines=4, elem_id="prompt")
                gr.Examples(EXAMPLES, inputs=[prompt], label="Example prompts")
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", elem_id="run")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop")
                compare = gr.Checkbox(False, label="Compare: also run each member alone", elem_id="compare")
                with gr.Accordion("Settings", open=False):
                    segment_len = gr.Slider(1, 64, value=d.segment_len, step=1, label="Segment length L")
                    max_new_tokens = gr.Slider(
                        1, 1024, value=d.max_new_tokens, step=1, label="Max new tokens"
                    )
                    temperature = gr.Slider(
                        0, 2, value=d.temperature, step=0.05, label="Temperature (0 = greedy)"
                    )
                    top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="Top-p")
                    seed = gr.Number(d.seed, precision=0, label="Seed")
                    feedback = gr.Checkbox(d.feedback, label="Online feedback")
                    learning_rate = gr.Slider(
                        0, 10, value=d.learning_rate, step=0.1, label="Learning-rate scale α"
                    )
                    exit_ = gr.Checkbox(d.exit, label="Model exit")
                    exit_threshold = gr.Slider(
                        0, 1, value=d.exit_threshold, step=0.05, label="Exit threshold δ"
                    )
                    exit_warmup = gr.Slider(0, 20, value=d.exit_warmup, step=1, label="Exit warm-up (rounds)")
                    self_scores = gr.Checkbox(d.self_scores, label="Include self-scores")
                    score = gr.Radio(list(SCORE_MODES), value=d.score, label="Score")
                    normalization = gr.Radio(
                        list(NORMALIZATIONS), value=d.normalization, label="Normalization"
                    )
                    device_box = gr.Dropdown(list(DEVICES), value=device, label="Device")
                with gr.Accordion("Replay a trace", open=False, elem_id="replay"):
                    upload = gr.File(label="Upload a trace (.json)", file_types=[".json"], elem_id="upload")
                download = gr.DownloadButton("Download trace", value=None, elem_id="download")
            with gr.Column(scale=3):
                status = gr.Markdown(status_markdown(()), elem_id="status")
                answer = gr.HighlightedText(
                    label="Answer",
                    show_legend=True,
                    combine_adjacent=False,
                    elem_id="answer",
                )
                segment = gr.HTML(elem_id="segment")
                round_slider = gr.Slider(
                    1, 2, value=1, step=1, label="Round (replay)", interactive=False, elem_id="round"
                )
                with gr.Row():
                    candidates = gr.Dataframe(
                        label="Candidates of the round",
                        headers=report.CANDIDATE_COLUMNS,
                        datatype=["str", "str", "number", "bool", "bool", "number", "number", "str"],
                        interactive=False,
                        wrap=True,
                        elem_id="candidates",
                    )
                with gr.Row():
                    with gr.Column():
                        view = gr.Radio([NORMALIZED, RAW], value=NORMALIZED, label="Matrix", elem_id="view")
                        matrix = gr.Plot(label="Verification matrix", elem_id="matrix")
                    weights = gr.Plot(label="Weights", elem_id="weights")
                exits = gr.Dataframe(
                    label="Exited members",
                    headers=report.EXIT_COLUMNS,
                    interactive=False,
                    wrap=True,
                    elem_id="exits",
                )
                summary = gr.Dataframe(
                    label="Per-member summary",
                    headers=report.SUMMARY_COLUMNS,
                    interactive=False,
                    elem_id="summary",
                )
                compared = gr.HTML(elem_id="compare-panel")

        settings = [
            segment_len,
            max_new_tokens,
            temperature,
            top_p,
            seed,
            feedback,
            learning_rate,
            exit_,
            exit_threshold,
            exit_warmup,
            self_scores,
            score,
            normalization,
        ]
        shown = [answer, status, candidates, matrix, weights, exits, summary]

        @gpu
        def run(
            members: list[str],
            prompt: str,
            segment_len: float,
            max_new_tokens: float,
            temperature: float,
            top_p: float,
            seed: float,
            feedback: bool,
            learning_rate: float,
            exit: bool,
            exit_threshold: float,
            exit_warmup: float,
            self_scores: bool,
            score: str,
            normalization: str,
            device: str,
            compare: bool,
            view: str,
            progress=gr.Progress(),  # noqa: B008 (Gradio's way to ask for a progress tracker)
        ) -> Iterator[tuple]:
            """Load the members (once, shared), then stream one update per round."""
            names, text, compare_on, view_name, device_name = members, prompt, compare, view, device
            form = (segment_len, max_new_tokens, temperature, top_p, seed, feedback, learning_rate)
            form += (exit, exit_threshold, exit_warmup, self_scores, score, normalization)
            try:
                names = _check_members(names, choices, allow_paths)
                config = make_config(*form)
                check_prompt(text)  # the engine checks it too; this fails before any loading
                devices = plan_devices(len(names), device_name)
                loaded: list[Member] = []
                for i, (name, dev) in enumerate(zip(names, devices)):

                    def report_load(fraction: float, message: str, i: int = i) -> None:
                        progress((i + fraction) / len(names), desc=message)

                    report_load(0.0, f"loading {name}")
                    try:
                        loaded.append(loader(name, dev, report_load))
                    except SpecfuseError:
                        raise
                    except Exception as e:  # the app's edge: any load failure is a message, not a crash
                        raise ModelLoadError(f"{name}: could not load: {type(e).__name__}: {e}") from e
                ensemble = Ensemble(loaded, config)
            except SpecfuseError as e:
                raise gr.Error(str(e)) from e
            rounds: list[Round] = []
            trace = None
            stream = ensemble.stream(text)
            try:
                for rnd in stream:
                    rounds.append(rnd)
                    trace = Trace(text, ensemble.names, config, tuple(rounds))
                    done = rnd.stop_reason is not None and not compare_on
                    yield (
                        trace,
                        *panels(trace, None, view_name),
                        slider_value(trace),
                        "",
                        write_trace(trace) if done else None,
                        compare_html([("ensemble", rnd.text)]) if compare_on else "",
                    )
                if compare_on and trace is not None:
                    columns = [("ensemble", trace.rounds[-1].text)]
                    for member in loaded:
                        alone = ""
                        for solo in Ensemble([member], config).stream(text):
                            alone = solo.text
                            yield (
                                gr.skip(),
                                *(gr.skip() for _ in shown),
                                gr.skip(),
                                gr.skip(),
                                None,
                                compare_html([*columns, (f"{member.name} alone", alone)]),
                            )
                        columns.append((f"{member.name} alone", alone))
                    yield (
                        trace,
                        *panels(trace, None, view_name),
                        slider_value(trace),
                        "",
                        write_trace(trace),
                        compare_html(columns),
                    )
            except SpecfuseError as e:
                raise gr.Error(str(e)) from e
            finally:
                stream.close()  # a cancelled job closes this generator: the engine's states go with it

        def stop(trace: Trace | None):
            """After a cancel: keep what was produced and offer it as a trace."""
            if trace is None or not trace.rounds:
                return gr.skip(), gr.skip()
            return status_markdown(trace.rounds, "stopped by the user"), write_trace(trace)

        def replay(trace: Trace | None, k: float, view_name: str):
            if trace is None or not trace.rounds:
                return tuple(gr.skip() for _ in shown)
            return panels(trace, int(k), view_name)

        def select_segment(trace: Trace | None, view_name: str, evt: gr.SelectData):
            if trace is None or not trace.rounds or not isinstance(evt.index, int):
                return (gr.skip(), *(gr.skip() for _ in shown), gr.skip())
            k = min(evt.index + 1, len(trace.rounds))
            return (segment_html(trace.rounds, k - 1), *panels(trace, k, view_name), slider_value(trace, k))

        def load_trace_file(path: str | None, view_name: str):
            if not path:
                return (gr.skip(), *(gr.skip() for _ in shown), gr.skip(), gr.skip(), gr.skip())
            size = os.path.getsize(path)
            if size > MAX_TRACE_BYTES:
                raise gr.Error(f"The trace is {size:,} bytes; the limit is {MAX_TRACE_BYTES:,}.")
            try:
                with open(path, "rb") as f:
                    trace = parse_trace(f.read().decode("utf-8"))
            except UnicodeDecodeError as e:
                raise gr.Error(f"The trace is not UTF-8 text: {e}") from e
            except TraceError as e:
                raise gr.Error(f"Not a valid specfuse trace: {e}") from e
            if not trace.rounds:
                raise gr.Error("The trace has no rounds to replay.")
            note = f"replayed from a trace of {len(trace.members)} members"
            return (trace, *panels(trace, None, view_name, note), slider_value(trace), "", write_trace(trace))

        run_event = run_button.click(
            run,
            [models, prompt, *settings, device_box, compare, view],
            [trace_state, *shown, round_slider, segment, download, compared],
            api_name="run",
            concurrency_limit=concurrency_limit,
            concurrency_id="run",
        )
        submit_event = prompt.submit(
            run,
            [models, prompt, *settings, device_box, compare, view],
            [trace_state, *shown, round_slider, segment, download, compared],
            api_visibility="private",
            concurrency_limit=concurrency_limit,
            concurrency_id="run",
        )
        stop_button.click(
            stop, [trace_state], [status, download], cancels=[run_event, submit_event], api_name="stop"
        )
        round_slider.release(replay, [trace_state, round_slider, view], shown, api_name="replay")
        view.change(replay, [trace_state, round_slider, view], shown, api_visibility="private")
        answer.select(
            select_segment, [trace_state, view], [segment, *shown, round_slider], api_visibility="private"
        )
        upload.upload(
            load_trace_file,
            [upload, view],
            [trace_state, *shown, round_slider, segment, download],
            api_name="load_trace",
        )
    return demo


def _check_members(names: Any, choices: Sequence[str], allow_paths: bool) -> list[str]:
    """Two or more distinct members, each from the catalogue unless paths and hub ids are allowed."""
    if isinstance(names, str):
        names = [names]
    names = [str(n).strip() for n in names or [] if str(n).strip()]
    if len(set(names)) < 2:
        raise ConfigError("Pick two or more different members: an ensemble of one is that model alone.")
    if len(set(names)) != len(names):
        raise ConfigError(f"Each member may be picked once; got {', '.join(names)}.")
    unknown = [n for n in names if n not in choices]
    if unknown and not allow_paths:
        raise UnknownModelError(
            f"Unknown model {unknown[0]!r}; known: {', '.join(choices)}. "
            "Start the app with --allow-paths to use local folders or hub ids."
        )
    return names


def serve(
    demo: gr.Blocks,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    max_size: int = 16,
    concurrency: int = 1,
    run_history: bool = False,
    prevent_thread_lock: bool = False,
) -> tuple[Any, str, str]:
    """Queue (bounded) and launch with the Gradio 6 conventions: theme and CSS in launch(), no SSR."""
    css_path = ASSETS / "app.css"
    demo.queue(max_size=max_size, default_concurrency_limit=concurrency)
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        ssr_mode=False,  # SSR needs Node 24+
        run_history=run_history,
        footer_links=["api", "settings"],
        max_file_size=MAX_TRACE_BYTES,
        theme=gr.themes.Soft(),
        css_paths=[css_path] if css_path.exists() else None,
        prevent_thread_lock=prevent_thread_lock,
        quiet=prevent_thread_lock,
    )


def space_arguments() -> list[str] | None:
    """On a Hugging Face Space (started as plain `python app.py`): the arguments in spaces_config.yaml.

    SPECFUSE_APP_ARGS overrides them anywhere; None elsewhere, so argparse reads the command line.
    """
    if "SPECFUSE_APP_ARGS" in os.environ:
        return shlex.split(os.environ["SPECFUSE_APP_ARGS"])
    config = Path(__file__).resolve().parent / "spaces_config.yaml"
    if not os.environ.get("SPACE_ID") or not config.exists():
        return None
    import yaml  # a Gradio dependency

    return shlex.split(str(yaml.safe_load(config.read_text(encoding="utf-8")).get("app_args", "")))


def main(argv: Sequence[str] | None = None) -> None:
    from specfuse.catalogue import CATALOGUE, DEFAULT_MEMBERS, plan_devices

    parser = argparse.ArgumentParser(prog="app.py", description="SpecFuse Studio: the Gradio app.")
    parser.add_argument(
        "--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), help="address to bind"
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="open a public gradio.live link")
    parser.add_argument(
        "--allow-paths", action="store_true", help="let users name local checkpoint folders or hub ids"
    )
    parser.add_argument(
        "--models", nargs="+", default=list(DEFAULT_MEMBERS), help="the members selected at start"
    )
    parser.add_argument(
        "--device", default="auto", choices=DEVICES, help="where members load (auto: GPUs if any)"
    )
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    parser.add_argument("--preload", action="store_true", help="load the default members before serving")
    parser.add_argument("--queue-size", type=int, default=16, help="requests waiting at most")
    parser.add_argument("--concurrency", type=int, default=1, help="runs at once (the members are shared)")
    parser.add_argument("--run-history", action="store_true", help="keep Gradio's per-browser run history")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="SPEC",
        help="offer a served member, ENGINE:URL#NAME[?tokenizer=...] (repeatable; docs/remote.md)",
    )
    args = parser.parse_args(space_arguments() if argv is None and len(sys.argv) == 1 else argv)

    loader = SharedLoader(
        allow_paths=args.allow_paths, trusted=[*args.models, *args.server], dtype=args.dtype
    )
    choices = list(dict.fromkeys([*CATALOGUE, *args.models, *args.server]))
    if args.preload:
        from specfuse.catalogue import tqdm_progress

        try:
            for name, dev in zip(args.models, plan_devices(len(args.models), args.device)):
                loader(name, dev, tqdm_progress(name))
        except SpecfuseError as e:
            parser.exit(2, f"error: {e}\n")
    demo = build_demo(
        loader,
        choices=choices,
        default_models=args.models,
        allow_paths=args.allow_paths,
        device=args.device,
        plan_devices=plan_devices,
        concurrency_limit=args.concurrency,
    )
    serve(
        demo,
        host=args.host,
        port=args.port,
        share=args.share,
        max_size=args.queue_size,
        concurrency=args.concurrency,
        run_history=args.run_history,
    )


if __name__ == "__main__":
    main()
