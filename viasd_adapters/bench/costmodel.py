"""A cost model: a method's wall time predicted from its forward-pass counts and a latency profile.

Every benchmark record holds, per model, how many forward passes ran and how many tokens they
fed (`DecodeStats.model_calls`: `calls`, `tokens`). A `LatencyProfile` says what one forward
costs on a device, as a function of the tokens it feeds `n` and the decoder layers it runs `l`:

    ms(n, l) = a + b * l + (c + d * l) * n          (decode-sized forwards, n <= ~16)

`a` and `c` are what does not scale with depth (embedding, final norm, LM head, Python and
cache bookkeeping per call), `b` and `d` one decoder layer. It is fitted by least squares on
forwards of the target with some layers skipped (routing masks), so the slim verifier of any
mask is priced by its `l` without a measurement of its own. The draft is a different model:
it gets its own line `ms(n) = a + c * n`. The first forward of a generation (prefill, the whole
prompt) is priced on a separate line per model, fitted on prompt-sized forwards; the prompt's
share of the first call is taken from the record (`prompt_tokens`).

With a linear `ms(n)`, the total over a generation depends only on the counts the records
keep: `(calls - 1) * ms(0, l) + (tokens - prompt) * slope(l) + prefill(prompt, l)`.
What the model leaves out: drafting's sampling and the verifier's bookkeeping between
forwards (counted in the measured time, not in the prediction). The validation on the
benchmark's own records (`validate`) states the error this causes.

Modelled profiles (`LatencyProfile.synthetic`) describe a device by ratios only (a draft step
at 0.05 of a target step, a verify as cheap as a decode step, as on a GPU): their predictions
are modelled figures and are labelled as such wherever they are printed.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls
import torch

ROLES = ("target", "draft", "slim")  # `DecodeStats.model_calls` keys the model prices


@dataclass(frozen=True)
class Line:
    """ms of one forward as an affine function of tokens fed and layers run (see module doc)."""

    a: float  # ms per call, depth-independent
    b: float = 0.0  # ms per call per layer
    c: float = 0.0  # ms per token, depth-independent
    d: float = 0.0  # ms per token per layer

    def ms(self, tokens: float, layers: float = 0.0) -> float:
        return self.a + self.b * layers + (self.c + self.d * layers) * tokens

    def per_call(self, layers: float = 0.0) -> float:
        return self.a + self.b * layers

    def per_token(self, layers: float = 0.0) -> float:
        return self.c + self.d * layers


@dataclass
class Measurement:
    """One timed forward shape: median ms over repetitions."""

    role: str  # "target" (with `layers` run; fewer than L: a routing mask) or "draft"
    layers: float  # decoder layers run (sub-blocks count by their share of a layer)
    tokens: int  # new tokens fed
    context: int  # tokens cached before it
    ms: float  # median
    repetitions: int


def from_profile_entries(entries, target: str, draft: str | None, num_layers: int, dtype: str,
                         threads: int) -> list[Measurement]:
    """Measurements from the entries of a `viasd-profile` cache (viasd_adapters.profile: `model`,
    `dtype`, `threads`, `context`, `new_tokens`, `layers` (None: the whole model), `ms`, `repeats`),
    so a device profiled there can be priced here. Entries of other models, dtypes or thread
    counts are left out; those with context 0 are prompt-sized (prefill) forwards."""
    out = []
    for e in entries:
        if e.dtype != dtype or e.threads != threads or e.model not in (target, draft):
            continue
        role = "target" if e.model == target else "draft"
        layers = float(e.layers) if e.layers is not None else (float(num_layers) if role == "target" else 0.0)
        out.append(Measurement(role, layers, int(e.new_tokens), int(e.context), float(e.ms), int(e.repeats)))
    return out


def fit_line(points: list[Measurement], with_layers: bool) -> Line:
    """Least-squares `Line` through measurements (ms against tokens, and layers when asked).

    Non-negative: every term is a cost, and an unconstrained fit to noisy timings (a busy host)
    can price a forward below zero."""
    if not points:
        raise ValueError("no measurements to fit")
    n = np.array([p.tokens for p in points], dtype=float)
    y = np.array([p.ms for p in points], dtype=float)
    if with_layers:
        l = np.array([p.layers for p in points], dtype=float)
        X = np.stack([np.ones_like(n), l, n, n * l], axis=1)
    else:
        X = np.stack([np.ones_like(n), n], axis=1)
    coef, _ = nnls(X, y)
    if with_layers:
        return Line(*map(float, coef))
    return Line(a=float(coef[0]), c=float(coef[1]))


@dataclass
class LatencyProfile:
    """What forwards cost on one device: fitted lines, with the raw measurements behind them."""

    device: str  # e.g. "Intel(R) Xeon(R) Platinum 8481C, 2 cores, torch threads 2" or "modelled: ..."
    num_layers: int  # L of the target
    decode: dict[str, Line]  # "target" (fitted over layers) and "draft": forwards of a few tokens
    prefill: dict[str, Line]  # the first forward of a generation (the prompt), per model
    measurements: list[Measurement] = field(default_factory=list)
    modelled: bool = False  # True: ratios assumed, not measured (never mix with measured figures)
    facts: dict = field(default_factory=dict)  # dtype, threads, torch version, date

    # ------------------------------------------------------------------ pricing
    def _priced_as(self, role: str, slim: float | str | None, full: float | None = None) -> tuple[str, float]:
        """(line, layers) that price a forward of `role`: the slim verifier is the target running
        `slim` layers, or, for an independent middle model (slim="draft"), the draft; the target
        runs `full` layers (an escalation over a shared prefix) or all of them."""
        if role not in ROLES:
            raise ValueError(f"model_calls key {role!r} is not one the cost model prices ({ROLES})")
        if role == "slim":
            if slim is None:
                raise ValueError("pricing a slim forward needs the layers it runs (or 'draft' for a separate model)")
            return ("draft", 0.0) if slim == "draft" else ("target", float(slim))
        if role == "target":
            return role, float(self.num_layers if full is None else full)
        return role, 0.0

    def forward_ms(self, role: str, tokens: int, slim: float | str | None = None, first: bool = False,
                   full: float | None = None) -> float:
        """ms of one forward of `tokens` new tokens (`first`: the generation's prefill)."""
        line, layers = self._priced_as(role, slim, full)
        if line not in self.decode:
            raise ValueError(f"the profile has no {line!r} line (it prices {sorted(self.decode)})")
        if first:  # a slim prefill runs its share of the target's layers
            scale = layers / self.num_layers if line == "target" else 1.0
            return scale * self.prefill[line].ms(tokens)
        return self.decode[line].ms(tokens, layers)

    def seconds(self, model_calls: dict[str, dict], prompt_tokens: int, slim: float | str | None = None,
                full: float | None = None) -> float:
        """Predicted wall seconds of a generation from its `model_calls` ({role: {calls, tokens}}).
        `slim`: layers the slim verifier runs; `full`: layers a target forward runs (escalations
        over a shared prefix run L - p; None: all L)."""
        total_ms = 0.0
        for role, c in model_calls.items():
            calls, tokens = int(c["calls"]), int(c["tokens"])
            if calls == 0:
                continue
            first = min(prompt_tokens, tokens)
            line, layers = self._priced_as(role, slim, full)
            decode = self.decode[line]
            total_ms += self.forward_ms(role, first, slim, first=True, full=full)
            total_ms += (calls - 1) * decode.per_call(layers) + (tokens - first) * decode.per_token(layers)
        return total_ms / 1e3

    # ------------------------------------------------------------------ building
    @classmethod
    def fit(cls, measurements: list[Measurement], num_layers: int, device: str, prefill_min_tokens: int = 32,
            facts: dict | None = None) -> LatencyProfile:
        """Fit decode lines on forwards of fewer than `prefill_min_tokens` tokens, prefill lines on the rest."""
        decode, prefill = {}, {}
        for role in ("target", "draft"):
            mine = [m for m in measurements if m.role == role]
            small = [m for m in mine if m.tokens < prefill_min_tokens]
            large = [m for m in mine if m.tokens >= prefill_min_tokens]
            if not small:
                continue
            with_layers = role == "target" and len({m.layers for m in small}) > 1
            decode[role] = fit_line(small, with_layers)
            whole = [m for m in large if role != "target" or m.layers == num_layers]
            if len(whole) >= 2:
                prefill[role] = fit_line(whole, False)
            else:  # no prompt-sized forwards measured: price the prompt on the decode line
                d = decode[role]
                layers = num_layers if role == "target" else 0.0
                prefill[role] = Line(a=d.per_call(layers), c=d.per_token(layers))
        if "target" not in decode:
            raise ValueError("a profile needs decode-sized measurements of the target")
        return cls(device, num_layers, decode, prefill, measurements, False, dict(facts or {}))

    @classmethod
    def synthetic(cls, num_layers: int, draft_ratio: float, per_layer_share: float = 0.9,
                  verify_token_ratio: float = 0.0, name: str | None = None) -> LatencyProfile:
        """A modelled device, in units of one target decode step (1.0).

        Args:
            draft_ratio: one draft step relative to one target step (0.05-0.1 on a GPU).
            per_layer_share: share of a target step that scales with its decoder layers (the rest:
                embedding, LM head, launch overhead), which decides what a slim forward costs.
            verify_token_ratio: extra cost of each further token fed, relative to a step (about 0 on
                a GPU for a few tokens: a verify of K tokens costs one step).
        """
        if draft_ratio <= 0 or not 0 <= per_layer_share <= 1:
            raise ValueError(f"need draft_ratio > 0 and 0 <= per_layer_share <= 1, got {draft_ratio}, {per_layer_share}")
        b = per_layer_share / num_layers
        a = 1.0 - per_layer_share
        target = Line(a=a, b=b, c=verify_token_ratio * a, d=verify_token_ratio * b)
        draft = Line(a=draft_ratio, c=verify_token_ratio * draft_ratio)
        label = name or (f"modelled: draft {draft_ratio:g} of a target step, verify of K tokens "
                         f"{'= one step' if verify_token_ratio == 0 else f'+{verify_token_ratio:g} per token'}")
        # Units of "ms" are target steps here; prefill priced as a step (GPU prefill of a short prompt).
        return cls(label, num_layers, {"target": target, "draft": draft},
                   {"target": Line(a=1.0), "draft": Line(a=draft_ratio)}, [], True,
                   {"draft_ratio": draft_ratio, "per_layer_share": per_layer_share,
                    "verify_token_ratio": verify_token_ratio})

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {
            "device": self.device, "num_layers": self.num_layers, "modelled": self.modelled, "facts": self.facts,
            "decode": {k: asdict(v) for k, v in self.decode.items()},
            "prefill": {k: asdict(v) for k, v in self.prefill.items()},
            "measurements": [asdict(m) for m in self.measurements],
        }

    @classmethod
    def from_dict(cls, data: dict) -> LatencyProfile:
        return cls(data["device"], data["num_layers"], {k: Line(**v) for k, v in data["decode"].items()},
                   {k: Line(**v) for k, v in data["prefill"].items()},
                   [Measurement(**m) for m in data.get("measurements", [])], data.get("modelled", False),
                   data.get("facts", {}))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> LatencyProfile:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"latency profile {str(path)!r} does not exist: measure one with viasd-costmodel mode=profile")
        return cls.from_dict(json.loads(path.read_text()))


# ---------------------------------------------------------------------- measuring


def cpu_name() -> str:
    """The CPU model as the kernel reports it (platform.processor() is often empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import os

    return f"{cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forwards(runners: dict[str, tuple[object, str, float]], context_ids: torch.Tensor, tokens: list[int],
                  repetitions: int = 5, warmup: int = 1) -> list[Measurement]:
    """Median ms of forwards of each size in `tokens` after `context_ids` ([1, C]), per runner, interleaved.

    `runners`: key -> (CausalLMRunner, role, layers run). Each repetition rolls every cache back to
    the context (the runner crops to the common prefix) and feeds the same new tokens; the order
    of runners rotates between repetitions so drift hits all alike.
    """
    B, C = context_ids.shape
    device = context_ids.device
    keys = list(runners)
    for runner, _, _ in runners.values():
        runner.logits(context_ids, 1)  # prefill the context once
    out = []
    for n in tokens:
        block = context_ids[:, :n]  # [1, n] arbitrary ids
        sequence = torch.cat([context_ids, block], dim=1)
        times: dict[str, list[float]] = {k: [] for k in keys}
        for rep in range(warmup + repetitions):
            shift = rep % len(keys)
            for key in keys[shift:] + keys[:shift]:
                runner = runners[key][0]
                _sync(device)
                begin = time.perf_counter()
                runner.logits(sequence, n)  # crops to the context, feeds n tokens, n logits (a verify)
                _sync(device)
                if rep >= warmup:
                    times[key].append(1e3 * (time.perf_counter() - begin))
        for key in keys:
            _, role, layers = runners[key]
            out.append(Measurement(role, layers, n, C, statistics.median(times[key]), repetitions))
    return out


def time_prefill(runners: dict[str, tuple[object, str, float]], prompt_ids: torch.Tensor, lengths: list[int],
                 repetitions: int = 3) -> list[Measurement]:
    """Median ms of a first forward (empty cache) over the first `n` tokens of `prompt_ids`, per length."""
    out = []
    device = prompt_ids.device
    for n in lengths:
        ids = prompt_ids[:, :n]
        for key, (runner, role, layers) in runners.items():
            times = []
            for _ in range(repetitions):
                runner.reset()
                _sync(device)
                begin = time.perf_counter()
                runner.logits(ids, 1)
                _sync(device)
                times.append(1e3 * (time.perf_counter() - begin))
            out.append(Measurement(role, layers, n, 0, statistics.median(times), repetitions))
    return out


def measure_profile(target, draft, masks: list, context: int = 128, tokens: tuple[int, ...] = (1, 4, 8),
                    prefill: tuple[int, ...] = (64, 192), repetitions: int = 5) -> LatencyProfile:
    """Measure a `LatencyProfile`: the target whole and with each mask, the draft, decode and prefill.

    Args:
        target, draft: loaded `PreTrainedModel`s (draft may be None).
        masks: `RoutingMask`s whose slim views give the layer dimension (at least one is needed
            for the per-layer terms; masks of different depth make the fit well posed).
        context: tokens cached before each decode-sized forward.
    """
    from ..routing import SlimModel
    from ..runner import CausalLMRunner
    from ..search.space import attention_share

    L = int(target.config.num_hidden_layers)
    share = attention_share(target)
    device = target.device
    limit = int(target.config.max_position_embeddings) - max(tokens)
    if max(context, *prefill) > limit:
        raise ValueError(f"context {context} / prefill {prefill} do not fit the target's window ({limit + max(tokens)})")
    generator = torch.Generator().manual_seed(0)
    vocab = int(target.config.vocab_size)
    ids = torch.randint(0, vocab, (1, max(context, *prefill)), generator=generator).to(device)  # [1, T] arbitrary ids
    runners = {"target": (CausalLMRunner(target, "target"), "target", float(L))}
    for mask in masks:
        layers = L - mask.skipped_cost(share)
        runners[f"slim {mask.describe()}"] = (CausalLMRunner(SlimModel(target, mask), "slim"), "target", layers)
    if draft is not None:
        runners["draft"] = (CausalLMRunner(draft, "draft"), "draft", float(draft.config.num_hidden_layers))
    with torch.inference_mode():
        measured = time_forwards(runners, ids[:, :context], list(tokens), repetitions)
        full_and_draft = {k: v for k, v in runners.items() if k in ("target", "draft")}
        measured += time_prefill(full_and_draft, ids, list(prefill), max(2, repetitions // 2))
    facts = {"dtype": str(target.dtype).replace("torch.", ""), "torch": torch.__version__,
             "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"), "context": context,
             "masks": [m.describe() for m in masks]}
    return LatencyProfile.fit(measured, L, device_name(device), min(prefill), facts)


# ---------------------------------------------------------------------- validation


@dataclass
class Prediction:
    """Predicted against measured speed of one method (medians over its records)."""

    method: str
    records: int
    measured_tok_s: float
    predicted_tok_s: float
    error: float  # predicted / measured - 1 (median over records)
    measured_speedup: float | None  # vs the baseline, median of per-record ratios
    predicted_speedup: float | None


def predict_records(records: list[dict], profile: LatencyProfile, slim_layers: dict[str, float | str],
                    baseline: str = "ar", full_layers: dict[str, float] | None = None) -> list[Prediction]:
    """Per method: the profile's predicted tokens/s and speedup against `baseline`, beside the measured.

    `slim_layers`: method name -> layers its slim verifier runs, or "draft" when its middle tier is
    the separate draft model (methods without a slim model need no entry). `full_layers`: method
    name -> layers its target forwards run (shared-prefix escalations: L - p); absent: all L. Speedups pair records of the same (task, prompt, rep) as the harness does.
    """
    predicted: dict[int, float] = {}
    for k, r in enumerate(records):
        seconds = profile.seconds(r["model_calls"], r["prompt_tokens"], slim_layers.get(r["method"]),
                                  (full_layers or {}).get(r["method"]))
        predicted[k] = r["new_tokens"] / seconds if seconds > 0 else 0.0
    base = {(r.get("task"), r["prompt_id"], r["rep"]): k for k, r in enumerate(records) if r["method"] == baseline}
    out = []
    for method in dict.fromkeys(r["method"] for r in records):
        mine = [k for k, r in enumerate(records) if r["method"] == method]
        errors = [predicted[k] / records[k]["tokens_per_second"] - 1 for k in mine if records[k]["tokens_per_second"]]
        speedups_m, speedups_p = [], []
        for k in mine:
            b = base.get((records[k].get("task"), records[k]["prompt_id"], records[k]["rep"]))
            if b is not None and records[b]["tokens_per_second"] and predicted[b]:
                speedups_m.append(records[k]["tokens_per_second"] / records[b]["tokens_per_second"])
                speedups_p.append(predicted[k] / predicted[b])
        out.append(Prediction(
            method, len(mine), statistics.median(records[k]["tokens_per_second"] for k in mine),
            statistics.median(predicted[k] for k in mine), statistics.median(errors) if errors else float("nan"),
            statistics.median(speedups_m) if speedups_m else None,
            statistics.median(speedups_p) if speedups_p else None,
        ))
    return out


def validation_table(predictions: list[Prediction], device: str) -> str:
    lines = [f"Cost model against measurement on {device} (medians over each method's records).", "",
             "| method | n | measured tok/s | predicted tok/s | error | measured speedup vs ar | predicted speedup vs ar |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    for p in predictions:
        lines.append(f"| {p.method} | {p.records} | {p.measured_tok_s:.2f} | {p.predicted_tok_s:.2f} | "
                     f"{100 * p.error:+.0f} % | {fmt(p.measured_speedup)} | {fmt(p.predicted_speedup)} |")
    errors = [abs(p.error) for p in predictions if p.error == p.error]
    speed_errors = [abs(p.predicted_speedup / p.measured_speedup - 1) for p in predictions
                    if p.measured_speedup and p.predicted_speedup]
    if errors:
        lines += ["", f"Median absolute error: tokens/s {100 * statistics.median(errors):.0f} %"
                      + (f", speedup vs ar {100 * statistics.median(speed_errors):.0f} %." if speed_errors else ".")]
    return "\n".join(lines)


def modelled_speedups(records: list[dict], profiles: list[LatencyProfile], slim_layers: dict[str, float | str],
                      baseline: str = "ar", full_layers: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """{profile.device: {method: median modelled speedup vs baseline}} from the measured call counts."""
    out = {}
    for profile in profiles:
        assert profile.modelled, "modelled_speedups is for modelled profiles; measured ones: predict_records"
        out[profile.device] = {p.method: p.predicted_speedup for p in predict_records(records, profile, slim_layers,
                                                                                       baseline, full_layers)}
    return out


# ---------------------------------------------------------------------- break-even


def settled_share_needed(draft_ratio: float, block: int, slim_ratio: float, escalate_ratio: float,
                         gain: float = 1.10) -> float | None:
    """Share of verify blocks the slim tier must settle for VIA-SD to run `gain` x its host (SD).

    Per round, with costs in target steps and the same tokens per round on both sides (VIA-SD's
    lossless points commit what SD commits):

        SD:     K * c + 1                       VIA-SD: K * c + s + (1 - settled) * e

    so settled >= 1 - ((K c + 1) / gain - K c - s) / e. None: out of reach even when every block
    settles (the slim pass alone costs too much next to the draft).

    Args:
        draft_ratio: c, one draft step / one target step.
        block: K, draft tokens per round.
        slim_ratio, escalate_ratio: s and e, a slim forward and an escalation / a full verify.
    """
    budget = _verify_budget(draft_ratio, block, gain) - slim_ratio
    if budget < 0:
        return None
    return max(0.0, 1.0 - budget / escalate_ratio)


def slim_ratio_needed(draft_ratio: float, block: int, settled: float, escalate_ratio: float,
                      gain: float = 1.10) -> float | None:
    """The most a slim forward may cost (/ a full verify) for VIA-SD to run `gain` x its host, when
    the slim tier settles `settled` of the blocks: the same round costs as `settled_share_needed`,
    solved for s = (K c + 1) / gain - K c - (1 - settled) e. None: out of reach even with a free
    slim pass."""
    budget = _verify_budget(draft_ratio, block, gain) - (1.0 - settled) * escalate_ratio
    return budget if budget >= 0 else None


def _verify_budget(draft_ratio: float, block: int, gain: float) -> float:
    """What VIA-SD may spend verifying one round, in target steps, to run `gain` x SD: the host's
    round (K c + 1) shrunk by the gain, less the same K c of drafting."""
    return (block * draft_ratio + 1.0) / gain - block * draft_ratio
