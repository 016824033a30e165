"""EnsembleConfig: every setting of one run (segment length, budgets, sampling, scoring, feedback, exit).

Declared once, as setting() fields; settings() describes them (type, default, help, choices, bounds,
group) for every view that offers or checks them: the CLI's flags, the app's form, the variants, the
API's request schema (pydantic, specfuse.serve.schema). Validated once, in __post_init__, with
ConfigError messages that name the setting and its range (check_setting: one value alone); the
machinery of setting() is declared.py. Stdlib only; knows nothing about models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError
from .declared import Setting, check_fields, setting, settings_of, show
from .declared import check_setting as check_setting  # one value alone: the API's and the form's checks

NORMALIZATIONS = ("zsoftmax", "minmax", "sum", "none")
AGGREGATIONS = ("mean", "median", "filtered")  # feedback.aggregate
PRIORS = ("trust", "uniform", "prompt")
SCORE_MODES = ("logit", "logprob")
# Where members run is the loaded members' property, not a run's: Ensemble(parallel=…) and the
# operator's --parallel flag take it (issue 42); PARALLEL_HELP is that flag's help everywhere.
PARALLEL_MODES = ("auto", "on", "off")
PARALLEL_HELP = (
    "members work at the same time: on, off, or auto (on several devices, or sharing a multi-core CPU)"
)
# How transformers members draft (issue 52), also the loaded members' property: the operator's
# --decode flag (flags.add_loading_flags: the CLI, specfuse-serve and the app) and load_member's `decode`.
DECODE_MODES = ("auto", "graphs", "eager")
DECODE_HELP = (
    "how transformers members draft: graphs (every batch on static KV slots, each batch size's step "
    "captured as a CUDA graph on a GPU, uncaptured on a CPU), eager (a stacked cache, step by step), "
    "or auto (graphs on a GPU, eager on a CPU)"
)
RETIRED_KEYS = ("parallel",)  # stored in configs by earlier versions; read and left out
VERIFY_MODES = ("always", "contested", "disagree")  # run.py: Run.take_candidates
# How sure the gatekeeper was of its segment (specfuse/engine/gate.py): the mean log-probability of its
# tokens, the probability of its least likely token, or the least margin (nats) of a token over the
# runner-up the drafter could have picked there. Higher is surer, for all three.
GATE_MEASURES = ("mean_logprob", "min_prob", "margin")
GATE_RANGES = {"mean_logprob": (-100.0, 0.0), "min_prob": (0.0, 1.0), "margin": (0.0, 100.0)}
# The threshold each measure takes when gate_threshold is left empty. mean_logprob's is the sweep's
# (docs/evaluation-log.md, "The gate on 300 rows"): the highest threshold whose accuracy held at the
# best member's on both sets, at its cost; the other two were never swept.
GATE_DEFAULTS = {"mean_logprob": -1.5, "min_prob": 0.5, "margin": 2.0}
MAX_SEGMENT_LEN = 256
# A seed is a signed 64-bit integer, as OpenAI's API and every sampler here take it; member i samples
# with seed + i, and torch takes at most 2**64 - 1, so a larger one would fail inside a member.
MAX_SEED = 2**63 - 1
# The smallest temperature that samples: logits / T must stay finite in float32 (a T of 1e-210 made
# every probability NaN inside a member); below it a sampler could only pick the greedy token anyway.
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class EnsembleConfig:
    """Settings of one ensemble run; every switch is documented in the README.

    The defaults are the variant that held the default trio at its best member's GSM8K accuracy
    (results/eval/gsm8k.md): log-prob scores, a trusted member's head start, rewards weighted by
    trust, a repeat penalty, and exit down to one member; and the weighted median of the votes,
    confirmed later on IFEval and GSM8K development data (docs/evaluation.md). PAPER holds the
    paper's rule.
    """

    segment_len: int = setting(
        10, "L: tokens per candidate, in the drafter's own tokenizer", low=1, high=MAX_SEGMENT_LEN
    )
    max_new_tokens: int = setting(256, "answer budget, counted in the winning drafters' tokens", low=1)
    max_rounds: int | None = setting(None, "stop after this many rounds (none: no round limit)", low=1)
    temperature: float = setting(0.0, "sampling temperature; 0 = greedy", low=0.0, group="sampling")
    top_p: float = setting(1.0, "nucleus sampling mass, in (0, 1]", above=0.0, high=1.0, group="sampling")
    seed: int = setting(0, "sampling seed; member i uses seed + i", low=0, group="sampling")
    score: str = setting(
        "logprob",
        "raw score z_ij: mean raw logit (the paper) or mean log-probability",
        choices=SCORE_MODES,
        group="scoring",
    )
    normalization: str = setting(
        "zsoftmax",
        "how each verifier's row is normalized over the candidates",
        choices=NORMALIZATIONS,
        group="scoring",
    )
    self_scores: bool = setting(True, "count each verifier's score of its own candidate", group="scoring")
    contrastive: bool = setting(
        False,
        "score each candidate relative to its drafter's own score of it (z_ij − z_jj) before normalizing",
        group="scoring",
    )
    prompt_contrast: float = setting(
        0.0,
        "score each candidate by how much the prompt raises its likelihood: z_ij minus this weight times "
        "z_ij with the prompt left out (0 = off; costs a second context and verify pass per member)",
        low=0.0,
        high=1.0,
        group="scoring",
    )
    aggregation: str = setting(
        "median",
        "how the verifiers' scores of a candidate combine: weighted mean (the paper), weighted median, "
        "or filtered (votes far from the median dropped, SweetSpan-style)",
        choices=AGGREGATIONS,
        group="scoring",
    )
    outlier_gap: float = setting(
        0.25,
        "filtered aggregation: drop votes farther than this from the median",
        low=0.0,
        high=1.0,
        group="scoring",
    )
    repeat_penalty: float = setting(
        0.5,
        "subtract this × the share of a candidate's word 3-grams already in the answer (loops)",
        low=0.0,
        high=10.0,
        group="scoring",
    )
    prior: str = setting(
        "trust",
        "starting weights: each member's trust from evidence (a trust file, by default the catalogue's; "
        "a member without any gets the mean of the others'), uniform 1/N (the paper), or from each "
        "member's surprise at the prompt",
        choices=PRIORS,
        group="feedback",
    )
    initial_weights: tuple[float, ...] = setting(
        (),
        "starting weights, one per member in ensemble order (normalized; empty: the prior rule): "
        "say how far you trust each member before the first round",
        group="feedback",
    )
    prior_temperature: float = setting(
        0.1, "prompt prior: w ∝ exp(−nats per byte / T)", above=0.0, group="feedback"
    )
    weighted_rewards: bool = setting(
        True, "rewards count each verifier's comparisons with its weight", group="feedback"
    )
    feedback: bool = setting(True, "online feedback: weights follow the rewards", group="feedback")
    learning_rate: float = setting(1.0, "α in η_k = α / (N √k)", low=0.0, group="feedback")
    exit: bool = setting(True, "model exit: members whose candidates keep losing stop drafting", group="exit")
    exit_threshold: float = setting(
        0.5, "δ: a member exits when its keep-probability p_i < δ / |A_k|", low=0.0, high=1.0, group="exit"
    )
    exit_warmup: int = setting(3, "no exit before this many rounds have been played", low=0, group="exit")
    exit_temperature: float = setting(
        1.0, "τ_0: base temperature of the keep-probabilities", above=0.0, group="exit"
    )
    exit_min_active: int = setting(1, "never fewer drafting members than this", low=1, group="exit")
    exited_verify: bool = setting(
        False, "exited members keep scoring (else they leave the ensemble entirely)", group="exit"
    )
    echo_guard: bool = setting(
        True, "a candidate that leaves the answer a mere copy of the prompt cannot win", group="scoring"
    )
    loop_guard: bool = setting(
        False,
        "a candidate that would leave the answer ending in a loop (one block twice in a row) cannot win "
        "while another would not; while the answer ends in one, exited members draft again",
        group="scoring",
    )
    verify: str = setting(
        "contested",
        "when the members score the candidates: every round (always, the paper), whenever there is more "
        "than one draft (contested: a lone draft wins anyway, taken unscored), or only where the drafts "
        "disagree (also all the same text, or one a prefix of all the others: the shortest, unscored)",
        choices=VERIFY_MODES,
        group="scoring",
    )
    own_draft_scores: bool = setting(
        False,
        "a llama.cpp member scores its own candidate with the values it drafted it with, not in the verify "
        "pass: a third less verification with three drafters; other rounding, so other answers "
        "(docs/evaluation.md)",
        group="scoring",
    )
    stop_strings: tuple[str, ...] = setting((), "end the answer before any of these strings")
    gate: bool = setting(
        False,
        "gated rounds: the gatekeeper drafts first, and a segment it is sure of (gate_measure at least "
        "gate_threshold) is taken without the others drafting or verifying (no rewards, no exits); "
        "otherwise the full round runs with its draft",
        group="gate",
    )
    gate_member: str = setting(
        "", "the gatekeeper (empty: the active member of highest weight)", group="gate"
    )
    gate_measure: str = setting(
        "mean_logprob",
        "the gatekeeper's confidence in its segment: the mean log probability of its tokens, the least "
        "probability of one, or the least margin (nats) of one over the next likeliest token",
        choices=GATE_MEASURES,
        group="gate",
    )
    gate_threshold: float | None = setting(
        None,
        "a segment is sure when its gate_measure is at least this (mean_logprob: a log probability ≤ 0; "
        "min_prob: a probability in [0, 1]; margin: nats ≥ 0; empty: the measure's default)",
        low=-100.0,
        high=100.0,
        group="gate",
    )

    def __post_init__(self) -> None:
        check_fields(self)  # types, choices and bounds from each setting(): a new field is checked for free
        # Rules a setting() cannot say: positive sums, non-empty items, a bound that depends on another.
        if any(w < 0 for w in self.initial_weights) or (
            self.initial_weights and sum(self.initial_weights) <= 0
        ):
            raise ConfigError(
                "initial_weights must be non-negative numbers with a positive sum, "
                f"got {show(self.initial_weights)}"
            )
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}"
            )
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed must be at most 2**63 - 1 ({MAX_SEED}), got {show(self.seed)}")
        if not all(self.stop_strings):
            raise ConfigError("stop_strings must be a tuple of non-empty strings")
        low, high = GATE_RANGES[self.gate_measure]
        if self.gate_threshold is not None and not low <= self.gate_threshold <= high:
            raise ConfigError(
                f"gate_threshold must be in [{low:g}, {high:g}] for gate_measure {self.gate_measure}, "
                f"got {self.gate_threshold:g}"
            )

    @property
    def gate_bar(self) -> float:
        """The gate's threshold in use: gate_threshold, or its measure's default."""
        if self.gate_threshold is not None:
            return self.gate_threshold
        return GATE_DEFAULTS[self.gate_measure]

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    def member_settings(self, index: int) -> MemberSettings:
        """What member number `index` needs to know: its own seed, so identical members differ."""
        return MemberSettings(
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed + index,
            score=self.score,
            stop_strings=self.stop_strings,
            max_new_tokens=self.max_new_tokens,
            measure_prompt=self.prior == "prompt",
            own_draft_scores=self.own_draft_scores,
            measure_confidence=self.gate,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (the trace stores this)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnsembleConfig:
        """Rebuild (and re-validate) a config stored by to_dict; unknown keys are an error, and keys
        that earlier versions stored but that are no longer a run's (RETIRED_KEYS) are left out."""
        known = {s.name for s in settings()}
        unknown = set(data) - known - set(RETIRED_KEYS)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in data.items() if k in known})  # __post_init__: lists → tuples


# The paper's rule (SPEC.md), one switch away: mean raw logits normalized by their row sum, uniform
# starting weights, plain rewards, no repeat penalty, and exits that keep two drafters and verifiers.
PAPER: dict[str, Any] = {
    "score": "logit",
    "normalization": "sum",
    "aggregation": "mean",
    "prior": "uniform",
    "weighted_rewards": False,
    "repeat_penalty": 0.0,
    "exit_min_active": 2,
    "exited_verify": True,
    "verify": "always",
}


@dataclass(frozen=True)
class MemberSettings:
    """The part of the config a member acts on while drafting and scoring one request."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    score: str = "logit"
    stop_strings: tuple[str, ...] = ()
    max_new_tokens: int = 256
    measure_prompt: bool = False  # start() also measures the member's surprise at the prompt
    own_draft_scores: bool = False  # score its own draft as drafted (llama.cpp members)
    measure_confidence: bool = False  # a draft also says how sure it was (Candidate.confidence; the gate)
    # A request that asks for log-probabilities (the API's logprobs/top_logprobs/echo), not a run
    # setting: each scored token's log-probability kept whatever `score` is, and its k likeliest
    # alternatives (TokenScores.top; 0: none).
    logprobs: bool = False
    top_logprobs: int = 0
    # The API's echo: the context is the prefix token alone (BOS, else EOS), no template; the text to
    # score comes as a candidate, so each of its tokens is scored after the plain text before it.
    raw: bool = False


def settings(of: Any = None) -> tuple[Setting, ...]:
    """Every setting of a settings dataclass (EnsembleConfig unless `of` says), in order."""
    return settings_of(EnsembleConfig if of is None else of)


def setting_named(name: str) -> Setting | None:
    return next((s for s in settings() if s.name == name), None)
