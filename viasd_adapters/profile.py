"""The device's latency profile, milliseconds per forward pass measured once and cached, and
the cost model fitted to it.

A profile is a list of entries, one per measured configuration:

    model, dtype, threads, context (tokens already cached; 0: a prefill from an empty cache),
    new_tokens (tokens fed), layers (None: the whole model; a slim view's layers run otherwise)
    ->  ms (median), ms_min, repeats

It is measured by `viasd-profile`, `viasd-costmodel mode=profile` or `measure_profile`, and
cached as JSON (by default `$VIASD_CACHE/profiles/<cpu slug>.json`, ~/.cache/viasd-adapters/
profiles/), with the CPU, torch version and device it was measured with and each model's decoder
layers. Entries are keyed, so a later measurement (more models, another dtype, slim views) merges
into the same file instead of replacing it.

What reads it:

* `LatencyProfile.draft_costs` turns a draft/target pair into the cost ratios of Leviathan's
  formula (`viasd_adapters.decode.schedule`), and `choose_configuration` picks the target dtype,
  draft dtype and draft length with the highest expected tokens per second;
* `LatencyProfile.cost_model` fits a `CostModel`: what one forward costs as a function of the
  tokens it feeds `n` and the decoder layers it runs `l`,

      ms(n, l) = a + b * l + (c + d * l) * n          (decode-sized forwards, n <= ~16)

  `a` and `c` are what does not scale with depth (embedding, final norm, LM head, Python and
  cache bookkeeping per call), `b` and `d` one decoder layer. The target's line is fitted by
  least squares on its entries whole and as slim views (routing masks), so the slim verifier of
  any mask is priced by its `l` without a measurement of its own; the drafter (in the variant
  that runs: "bfloat16+int8-weight" is its own line) gets `ms(n) = a + c * n`. Prefill (the
  first forward of a generation) is priced on a separate line per model, fitted on the context-0
  entries. With a linear `ms(n)` a generation's total depends only on the counts benchmark
  records keep (`CostModel.seconds`; `bench/costmodel.py` prices records with it).

Modelled cost models (`CostModel.synthetic`) describe a device by ratios only (a draft step at
0.05 of a target step, a verify as cheap as a decode step, as on a GPU): their predictions are
modelled figures and are labelled as such wherever they are printed.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from scipy.optimize import nnls

from .decode.schedule import AdaptiveDraftLength, DraftCosts, best_draft_length, expected_speedup
from .draft import ModelDrafter
from .hardware import cpu_info, device_label, synchronize
from .models.offline import cache_root

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when an entry's meaning changes; older files are then measured again


def profile_dir() -> Path:
    return cache_root() / "profiles"


def default_profile_path(device: str = "cpu") -> Path:
    """Where this machine's profile lives: one file per CPU model (or accelerator name)."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        slug = "cuda-" + "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name(device).lower())
    else:
        slug = cpu_info().slug
    return profile_dir() / f"{slug}.json"


@dataclass(frozen=True)
class LatencyEntry:
    """One measured forward configuration."""

    model: str  # model name (a ModelSpec name)
    dtype: str  # float32 | bfloat16 | float16, or a quantised variant "<dtype>+<quantization>" (split_variant)
    threads: int  # torch intra-op threads
    context: int  # tokens already in the KV cache
    new_tokens: int  # tokens fed through the forward (1: a decode step; K + 1: a verify)
    ms: float  # median wall time of one forward
    ms_min: float = 0.0  # fastest of the repeats
    repeats: int = 1  # forwards timed
    layers: float | None = None  # decoder layers a slim view runs (sub-blocks by their share); None: the whole model

    @property
    def key(self) -> tuple:
        return (self.model, self.dtype, self.threads, self.context, self.new_tokens, self.layers)


@dataclass
class LatencyProfile:
    """The entries of one device, with what they were measured on."""

    device: str = "cpu"  # the torch device
    hardware: str = ""  # CPU label (model, instruction sets, cores) or accelerator name
    cpu: dict = field(default_factory=dict)  # `CpuInfo.to_dict()`
    torch_version: str = torch.__version__
    created: str = ""
    entries: list[LatencyEntry] = field(default_factory=list)
    format: int = FORMAT
    loadavg_1m: list[float] = field(default_factory=list)  # machine load at the start and end of the measurement
    model_layers: dict[str, int] = field(default_factory=dict)  # decoder layers (L) of each measured model

    # -- lookup -----------------------------------------------------------------------------
    def _of(self, model: str, dtype: str, threads: int) -> list[LatencyEntry]:
        """Entries of one model in one dtype at `threads`, whole and as slim views; a clear error when none."""
        if torch.device(self.device).type != "cpu":  # an accelerator's speed does not depend on CPU threads
            found = [e for e in self.entries if (e.model, e.dtype) == (model, dtype)]
        else:
            found = [e for e in self.entries if (e.model, e.dtype, e.threads) == (model, dtype, threads)]
        if not found:
            have = sorted({(e.model, e.dtype, e.threads) for e in self.entries})
            raise KeyError(
                f"the latency profile has no entry for {model} in {dtype} at {threads} thread(s);"
                f" it has {have}: run viasd-profile with that model, dtype and threads"
            )
        return found

    def has(self, model: str, dtype: str, threads: int, layers: float | None = None) -> bool:
        try:
            return any(e.layers == layers for e in self._of(model, dtype, threads))
        except KeyError:
            return False

    def ms(self, model: str, dtype: str, threads: int, new_tokens: int, context: int = 256, layers: float | None = None) -> float:
        """Milliseconds of one forward: the measured context nearest to `context`, linear in
        `new_tokens` between measured counts (extended by the last step beyond them)."""
        found = [e for e in self._of(model, dtype, threads) if e.layers == layers]
        if not found:
            raise KeyError(f"the latency profile has no entry for {model} in {dtype} at {threads} thread(s) running"
                           f" {'all' if layers is None else f'{layers:g}'} layers: measure it with viasd-profile (whole models)"
                           " or viasd-costmodel mode=profile (slim views)")
        points = sorted((e.new_tokens, e.ms) for e in _at_context(found, context))
        return _interpolate(points, new_tokens)

    def draft_costs(
        self, draft: str, target: str, dtype: str, draft_dtype: str, threads: int | None = None, context: int = 256, max_tokens: int = 17
    ) -> DraftCosts:
        """c and v(n) (n = 1..max_tokens) of a pair, in units of the target's single-token step."""
        threads = threads or torch.get_num_threads()
        step = self.ms(target, dtype, threads, 1, context)
        return DraftCosts(
            draft_step=self.ms(draft, draft_dtype, threads, 1, context) / step,
            verify=tuple(self.ms(target, dtype, threads, n, context) / step for n in range(1, max_tokens + 1)),
        )

    def merge(self, other: LatencyProfile) -> LatencyProfile:
        """This profile with `other`'s entries added; `other` wins where both measured a key."""
        entries = {e.key: e for e in self.entries}
        entries.update({e.key: e for e in other.entries})
        return LatencyProfile(other.device, other.hardware, other.cpu, other.torch_version, other.created,
                              list(entries.values()), loadavg_1m=self.loadavg_1m + other.loadavg_1m,
                              model_layers={**self.model_layers, **other.model_layers})

    def cost_model(self, target: str, draft: str | None = None, dtype: str = "bfloat16", draft_dtype: str | None = None,
                   threads: int | None = None, context: int = 256) -> CostModel:
        """The `CostModel` of `target` in `dtype` and `draft` in `draft_dtype` (default: `dtype`;
        a quantised variant is its own line), fitted on this profile's entries at `threads`
        (default: torch's): decode lines on the measured context nearest to `context`, prefill
        lines on the context-0 entries of the whole models (the decode line where there are
        fewer than two)."""
        threads = threads or torch.get_num_threads()
        if target not in self.model_layers:
            raise ValueError(f"the latency profile has no layer count for {target} (measured before the cost model"
                             " used one): run viasd-profile remeasure=true, or viasd-costmodel mode=profile")
        L = self.model_layers[target]
        decode, prefill = {}, {}
        for role, model, variant in (("target", target, dtype), ("draft", draft, draft_dtype or dtype)):
            if model is None:
                continue
            found = self._of(model, variant, threads)
            depth = (lambda e: float(L if e.layers is None else e.layers)) if role == "target" else (lambda e: 0.0)
            cached = [e for e in found if e.context > 0]
            if not cached:
                raise KeyError(f"the latency profile has only prefill entries for {model} in {variant}: measure"
                               " decode-sized forwards after a cached context (contexts > 0)")
            small = _at_context(cached, context)
            decode[role] = fit_line([(e.new_tokens, depth(e), e.ms) for e in small],
                                    with_layers=len({depth(e) for e in small}) > 1)
            whole = [e for e in found if e.context == 0 and e.layers is None]
            if len(whole) >= 2:
                prefill[role] = fit_line([(e.new_tokens, 0.0, e.ms) for e in whole], with_layers=False)
            else:  # no prompt-sized forwards measured: price the prompt on the decode line
                d, layers = decode[role], (L if role == "target" else 0.0)
                prefill[role] = Line(a=d.per_call(layers), c=d.per_token(layers))
        label = f"{self.hardware or self.device}, {threads} torch thread{'s' if threads > 1 else ''}"
        facts = {"dtype": dtype, "draft_dtype": draft_dtype or dtype, "threads": threads, "torch": self.torch_version,
                 "created": self.created}
        return CostModel(label, L, decode, prefill, False, facts)

    # -- files ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = asdict(self)
        out["entries"] = [asdict(e) for e in self.entries]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> LatencyProfile:
        data = dict(data)
        data["entries"] = [LatencyEntry(**e) for e in data.get("entries", [])]
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)  # a reader never sees half a file
        return path


def _at_context(entries: list[LatencyEntry], context: int) -> list[LatencyEntry]:
    """The entries measured at the context nearest to `context` (the smaller one on a tie)."""
    nearest = min({e.context for e in entries}, key=lambda c: (abs(c - context), c))
    return [e for e in entries if e.context == nearest]


def _interpolate(points: list[tuple[int, float]], x: int) -> float:
    """Piecewise-linear y(x) through sorted (x, y) points, extended by the end segments."""
    if len(points) == 1:
        return points[0][1] * x / points[0][0]  # one point: proportional to the tokens fed
    if x <= points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif x >= points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        (x0, y0), (x1, y1) = next((p, q) for p, q in zip(points, points[1:]) if p[0] <= x <= q[0])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def load_profile(path: str | Path | None = None, device: str = "cpu") -> LatencyProfile:
    """This machine's cached profile (or the one at `path`); a clear error when there is none."""
    path = Path(path) if path else default_profile_path(device)
    if not path.exists():
        raise FileNotFoundError(
            f"no latency profile at {path}: measure it once with `viasd-profile` (a few minutes;"
            " it is cached for later runs)"
        )
    data = json.loads(path.read_text())
    if "entries" not in data:  # e.g. the fitted lines an older viasd-costmodel wrote
        raise ValueError(f"{path} holds no measured entries (an older profile format): measure it again with"
                         " viasd-profile, or viasd-costmodel mode=profile")
    profile = LatencyProfile.from_dict(data)
    if profile.format != FORMAT:
        raise ValueError(f"{path} has profile format {profile.format}, this version reads {FORMAT}: run viasd-profile again")
    if profile.torch_version != torch.__version__:
        logger.warning("%s was measured with torch %s, this is %s: run viasd-profile again if kernels changed",
                       path, profile.torch_version, torch.__version__)
    return profile


# -- the cost model ---------------------------------------------------------------------------

ROLES = ("target", "draft", "slim")  # the `DecodeStats.model_calls` keys a cost model prices


@dataclass(frozen=True)
class Line:
    """ms of one forward as an affine function of tokens fed and layers run (see the module doc)."""

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


def fit_line(points: list[tuple[float, float, float]], with_layers: bool) -> Line:
    """Least-squares `Line` through (tokens, layers, ms) points: ms against tokens, and layers when asked.

    Non-negative: every term is a cost, and an unconstrained fit to noisy timings (a busy host)
    can price a forward below zero."""
    if not points:
        raise ValueError("no measurements to fit")
    n, l, y = (np.array(column, dtype=float) for column in zip(*points))
    X = np.stack([np.ones_like(n), l, n, n * l] if with_layers else [np.ones_like(n), n], axis=1)
    coef, _ = nnls(X, y)
    if with_layers:
        return Line(*map(float, coef))
    return Line(a=float(coef[0]), c=float(coef[1]))


@dataclass
class CostModel:
    """What a pair's forwards cost on one device: fitted lines (`LatencyProfile.cost_model`) or modelled ratios."""

    device: str  # e.g. "Intel(R) Xeon(R) ... (AMX-BF16, ...; 2 cores), 2 torch threads" or "modelled: ..."
    num_layers: int  # L of the target
    decode: dict[str, Line]  # "target" (over layers) and "draft": forwards of a few tokens
    prefill: dict[str, Line]  # the first forward of a generation (the prompt), per model
    modelled: bool = False  # True: ratios assumed, not measured (never mix with measured figures)
    facts: dict = field(default_factory=dict)  # dtypes, threads, torch version, date

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
            raise ValueError(f"the cost model has no {line!r} line (it prices {sorted(self.decode)})")
        if first:  # a slim prefill runs its share of the target's layers
            scale = layers / self.num_layers if line == "target" else 1.0
            return scale * self.prefill[line].ms(tokens)
        return self.decode[line].ms(tokens, layers)

    def seconds(self, model_calls: dict[str, dict], prompt_tokens: int, slim: float | str | None = None,
                full: float | None = None) -> float:
        """Predicted wall seconds of a generation from its `model_calls` ({role: {calls, tokens}}):
        `(calls - 1) * ms(0, l) + (tokens - prompt) * slope(l) + prefill(prompt, l)` per role.
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

    @classmethod
    def synthetic(cls, num_layers: int, draft_ratio: float, per_layer_share: float = 0.9,
                  verify_token_ratio: float = 0.0, name: str | None = None) -> CostModel:
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
                   {"target": Line(a=1.0), "draft": Line(a=draft_ratio)}, True,
                   {"draft_ratio": draft_ratio, "per_layer_share": per_layer_share,
                    "verify_token_ratio": verify_token_ratio})


# -- measuring -----------------------------------------------------------------------------

@torch.no_grad()
def time_forwards(models: dict, context: int, new_tokens: Iterable[int], repeats: int,
                  seed: int = 0) -> dict[object, dict[int, list[float]]]:
    """Milliseconds of each of `repeats` forwards per count in `new_tokens`, after `context`
    cached tokens, for each of `models` ({key: causal LM}, slim views too), as {key: {count: ms}}.

    The models take turns: each repetition runs every model once per count, in an order rotated
    between repetitions, so a machine's drift hits all alike. Ids are random (the cost of a dense
    forward does not depend on the text). The cache is cropped back to `context` before each
    forward, as a rejected draft block is (context 0: a prefill from an empty cache); every
    forward keeps the logits of all the tokens it is fed, as a verify does.
    """
    from .runner import CausalLMRunner

    counts, keys = list(new_tokens), list(models)
    runners = {key: CausalLMRunner(model, str(key)) for key, model in models.items()}
    device = runners[keys[0]].device
    vocab = int(runners[keys[0]].model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(vocab, (1, context), generator=gen).to(device)  # [1, C]
    if context:
        for runner in runners.values():
            runner.logits(prefix, 1)
    times: dict[object, dict[int, list[float]]] = {key: {n: [] for n in counts} for key in keys}
    for r in range(repeats + 1):  # repetition 0 warms the kernels up for every shape
        shift = r % len(keys)
        for n in counts:
            sequence = torch.cat([prefix, torch.randint(vocab, (1, n), generator=gen).to(device)], dim=1)  # [1, C + n]
            for key in keys[shift:] + keys[:shift]:
                synchronize(device)
                begin = time.perf_counter()
                runners[key].logits(sequence, n)  # crops the cache to the context, feeds n tokens
                synchronize(device)
                if r:
                    times[key][n].append(1000.0 * (time.perf_counter() - begin))
    return times


def split_variant(dtype: str) -> tuple[str, str | None]:
    """A profile dtype's (load dtype, quantization): "bfloat16+int8-weight" -> ("bfloat16", "int8-weight")."""
    base, _, quantization = dtype.partition("+")
    return base, quantization or None


@dataclass
class ProfileGrid:
    """What `measure_profile` measures (Hydra-instantiable: conf/profile.yaml).

    Every model in every dtype, and the `variant_models` (drafters) also in each quantised
    variant of `variants` ("<dtype>+<quantization>", what `ModelDrafter(quantize=...)` runs).
    """

    models: list[str]  # ModelSpec names
    dtypes: list[str] = field(default_factory=lambda: ["bfloat16", "float32"])
    variants: list[str] = field(default_factory=list)  # e.g. ["bfloat16+int8-weight"]
    variant_models: list[str] = field(default_factory=list)  # the models measured in `variants` too
    threads: list[int] = field(default_factory=lambda: [1, 2])  # clipped to the cores there are
    new_tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 6, 8, 12])
    contexts: list[int] = field(default_factory=lambda: [128, 512])
    prefill: list[int] = field(default_factory=list)  # prompt lengths also timed from an empty cache (context 0)
    repeats: int = 3  # timed forwards per point (one more warms up)

    def __post_init__(self) -> None:
        from .models.quantize import QUANTIZATIONS

        if not self.models and not self.variant_models:
            raise ValueError("name at least one model to profile (models=[...])")
        if bool(self.variants) != bool(self.variant_models):
            raise ValueError("variants and variant_models go together: name the quantised variants and the models"
                             " measured in them, or neither")
        for variant in self.variants:
            quantization = split_variant(variant)[1]
            if quantization not in QUANTIZATIONS:
                raise ValueError(f"variant {variant!r} is not <dtype>+<quantization> with a quantization of"
                                 f" {sorted(QUANTIZATIONS)}, e.g. bfloat16+int8-weight")
        for name in ("dtypes", "threads", "new_tokens", "contexts"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if min(self.new_tokens + self.prefill) < 1 or min(self.threads) < 1 or min(self.contexts) < 0 or self.repeats < 1:
            raise ValueError("new_tokens, prefill and threads must be >= 1, contexts >= 0, repeats >= 1")
        self.models, self.dtypes = list(dict.fromkeys(self.models)), list(dict.fromkeys(self.dtypes))
        self.variants, self.variant_models = list(dict.fromkeys(self.variants)), list(dict.fromkeys(self.variant_models))
        self.threads = sorted({int(t) for t in self.threads})
        self.new_tokens = sorted({int(n) for n in self.new_tokens})
        self.contexts = sorted({int(c) for c in self.contexts})
        self.prefill = sorted({int(n) for n in self.prefill})

    def combinations(self) -> list[tuple[str, str]]:
        """(model, dtype or variant) pairs, each loaded once."""
        return ([(m, d) for m in self.models for d in self.dtypes]
                + [(m, v) for m in self.variant_models for v in self.variants])

    @property
    def points(self) -> int:
        return len(self.combinations()) * len(self.threads) * len(self.contexts)


def usable_threads(threads: list[int], device: str = "cpu") -> list[int]:
    """The thread counts of a grid this machine can run (no more than its cores); on an
    accelerator only the first (CPU threads do not change its speed)."""
    if torch.device(device).type != "cpu":
        return threads[:1]
    cores = cpu_info().logical_cores
    return [t for t in threads if t <= cores] or [cores]


def measure_profile(
    grid: ProfileGrid,
    device: str = "cpu",
    load: Callable[[str, str, str], torch.nn.Module] | None = None,
    progress: bool = True,
    masks: dict[str, list] | None = None,
) -> LatencyProfile:
    """Measure every point of `grid`; `load(name, dtype, device)` returns a model (default: the
    project's model zoo). Each model is loaded once per dtype (a variant: its load dtype, then
    quantised as a drafter quantises it) and freed before the next.

    `masks`: model name -> `RoutingMask`s whose slim views of it are timed beside it (plain
    dtypes, decode-sized forwards), taking turns with the whole model: the cost model's layer
    dimension."""
    from tqdm.auto import tqdm

    from .models.quantize import quantized_copy

    load = load or _load_from_zoo
    masks = masks or {}
    saved = torch.get_num_threads()
    load_start = os.getloadavg()[0]
    threads = usable_threads(grid.threads, device)
    if threads != grid.threads:
        logger.warning("profiling threads %s of %s: this machine has %d cores", threads, grid.threads, cpu_info().logical_cores)
    entries, layers = [], {}
    # (context, counts, whether slim views are timed too): prefill is priced on the whole model only
    shapes = [(c, grid.new_tokens, True) for c in grid.contexts] + ([(0, grid.prefill, False)] if grid.prefill else [])
    bar = tqdm(total=len(grid.combinations()) * len(threads) * len(shapes),
               desc="latency profile", unit="point", disable=not progress)
    try:
        for name, dtype in grid.combinations():
            load_dtype, quantization = split_variant(dtype)
            model = load(name, load_dtype, device)
            _check_window(model, name, grid)
            layers[name] = int(model.config.num_hidden_layers)
            if quantization:
                model = quantized_copy(model, quantization)
            views = {None: model} if quantization else {None: model, **_slim_views(model, masks.get(name, ()))}
            for t in threads:
                torch.set_num_threads(t)
                for context, counts, slim in shapes:
                    bar.set_postfix_str(f"{name} {dtype} {t}t ctx {context}")
                    for key, row in time_forwards(views if slim else {None: model}, context, counts, grid.repeats).items():
                        entries += [LatencyEntry(name, dtype, t, context, n, statistics.median(ms), min(ms), len(ms), key)
                                    for n, ms in row.items()]
                    bar.update()
            del model, views
    finally:
        torch.set_num_threads(saved)
        bar.close()
    info = cpu_info()
    return LatencyProfile(
        device=str(device),
        hardware=device_label(device),
        cpu=info.to_dict(),
        torch_version=torch.__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        entries=entries,
        loadavg_1m=[load_start, os.getloadavg()[0]],
        model_layers=layers,
    )


def _check_window(model: torch.nn.Module, name: str, grid: ProfileGrid) -> None:
    window = int(model.config.max_position_embeddings)
    longest = max(max(grid.contexts) + max(grid.new_tokens), max(grid.prefill, default=0))
    if longest > window:
        raise ValueError(f"the grid's longest forward ({longest} tokens: contexts + new_tokens, or prefill) does not"
                         f" fit {name}'s window of {window} tokens")


def _slim_views(model: torch.nn.Module, masks) -> dict[float, torch.nn.Module]:
    """{layers run: slim view} of `model` per mask (masks of equal depth price alike: one is timed)."""
    from .routing import SlimModel
    from .search.space import attention_share

    if not masks:
        return {}
    L, share = int(model.config.num_hidden_layers), attention_share(model)
    return {float(L - mask.skipped_cost(share)): SlimModel(model, mask) for mask in masks}


def measure_pair(pair, masks: list, contexts: list[int], new_tokens: list[int], prefill: list[int], repeats: int,
                 quantizations: list[str] = (), progress: bool = False) -> LatencyProfile:
    """The profile a cost model needs of a loaded pair (`pipeline.ModelPair`), at this process's
    torch threads: the target whole and as the slim view of each mask, the draft in its dtype and
    in each of `quantizations` (the variants its drafter may run, e.g. "int8-weight")."""
    loaded = {m.spec.name: m for m in (pair.target, pair.draft) if m is not None}
    profile = None
    for name, m in loaded.items():
        is_draft = pair.draft is not None and name == pair.draft.spec.name
        variants = [f"{m.spec.dtype}+{q}" for q in quantizations] if is_draft else []
        grid = ProfileGrid(models=[name], dtypes=[m.spec.dtype], variants=variants,
                           variant_models=[name] if variants else [], threads=[torch.get_num_threads()],
                           new_tokens=new_tokens, contexts=contexts, prefill=prefill, repeats=repeats)
        fresh = measure_profile(grid, m.spec.device, lambda *_, model=m.model: model, progress,
                                {name: masks} if name == pair.target.spec.name else None)
        profile = fresh if profile is None else profile.merge(fresh)
    return profile


def _load_from_zoo(name: str, dtype: str, device: str) -> torch.nn.Module:
    from .models import ModelSpec, load_model

    return load_model(ModelSpec(name=name, dtype=dtype, device=device)).model


def missing_points(profile: LatencyProfile | None, grid: ProfileGrid, device: str = "cpu") -> ProfileGrid | None:
    """The part of `grid` (whole models x dtypes) `profile` lacks at the thread counts this
    machine can run; None if nothing."""
    if profile is None:
        return grid
    threads = usable_threads(grid.threads, device)
    need = [(m, d) for m, d in grid.combinations() if not all(profile.has(m, d, t) for t in threads)]
    if not need:
        return None
    plain = [(m, d) for m, d in need if d in grid.dtypes]
    variants = [(m, d) for m, d in need if d not in grid.dtypes]
    return ProfileGrid(
        models=sorted({m for m, _ in plain}, key=grid.models.index),
        dtypes=sorted({d for _, d in plain}, key=grid.dtypes.index) or grid.dtypes,
        variants=sorted({d for _, d in variants}, key=grid.variants.index),
        variant_models=sorted({m for m, _ in variants}, key=grid.variant_models.index),
        threads=grid.threads, new_tokens=grid.new_tokens, contexts=grid.contexts, prefill=grid.prefill,
        repeats=grid.repeats,
    )


# -- choosing ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """The configuration with the highest expected speed, and what it was compared with."""

    framework: str  # "sd" or "ar" (AR when no draft length beats it)
    dtype: str  # the target's dtype
    draft_dtype: str | None
    num_draft_tokens: int  # K (0 for AR)
    expected_speedup: float  # over the fastest AR (any dtype) at the same threads
    expected_tokens_per_second: float  # from the profile's costs and the assumed acceptance
    ar_tokens_per_second: float  # the fastest AR (any dtype) at the same threads
    threads: int
    acceptance: float  # the per-token acceptance a assumed
    fastest_ar_dtype: str = ""  # the target dtype of that fastest AR

    def describe(self) -> str:
        if self.framework == "ar":
            return f"greedy AR in {self.dtype} ({self.threads} thread{'s' if self.threads > 1 else ''}): no draft length beats it at a = {self.acceptance:.2f}"
        return (
            f"SD, target {self.dtype}, draft {self.draft_dtype}, K = {self.num_draft_tokens} at first"
            f" (adapted to the observed acceptance), {self.threads} thread{'s' if self.threads > 1 else ''}: expected"
            f" {self.expected_speedup:.2f}x the fastest AR at a = {self.acceptance:.2f}"
        )


def choose_configuration(
    profile: LatencyProfile,
    draft: str,
    target: str,
    acceptance: float,
    threads: int | Iterable[int],
    dtypes: Iterable[str] = ("bfloat16", "float32"),
    draft_dtypes: Iterable[str] | None = None,
    k_max: int = 8,
    context: int = 256,
) -> Choice:
    """The (threads, target dtype, draft dtype, K) with the most expected tokens per second.

    Expected tokens/s = S(a, K) / (target step in ms) * 1000; AR (K = 0) competes too, so a
    pair whose drafting cannot pay on this device decodes greedily. Given several thread
    counts, the fastest wins (on a busy host one thread can beat two). Dtypes and thread counts
    the profile lacks are skipped (an error when none is left). `draft_dtypes` may name
    quantised variants ("bfloat16+int8-weight"); default: `dtypes`.
    """
    dtypes = list(dtypes)
    draft_dtypes = list(draft_dtypes or dtypes)
    best: Choice | None = None
    for t in [threads] if isinstance(threads, int) else list(threads):
        targets = [d for d in dtypes if profile.has(target, d, t)]
        drafts = [d for d in draft_dtypes if profile.has(draft, d, t)]
        if not targets:
            continue
        # Speedups are over the fastest AR at these threads, whatever its dtype: a configuration
        # that only beats AR in a slow dtype is no gain.
        ar_speeds = {d: 1000.0 / profile.ms(target, d, t, 1, context) for d in targets}
        fastest_dtype = max(ar_speeds, key=ar_speeds.get)
        fastest_ar = ar_speeds[fastest_dtype]
        for dtype, ar in ar_speeds.items():
            options = [Choice("ar", dtype, None, 0, ar / fastest_ar, ar, fastest_ar, t, acceptance, fastest_dtype)]
            for draft_dtype in drafts:
                costs = profile.draft_costs(draft, target, dtype, draft_dtype, t, context, k_max + 1)
                k = best_draft_length(acceptance, costs, k_max)
                speed = expected_speedup(acceptance, k, costs) * ar
                options.append(Choice("sd", dtype, draft_dtype, k, speed / fastest_ar, speed, fastest_ar, t, acceptance,
                                      fastest_dtype))
            for option in options:
                if best is None or option.expected_tokens_per_second > best.expected_tokens_per_second:
                    best = option
    if best is None:
        raise ValueError(
            f"the profile lacks {target} at thread count(s) {threads} in the dtypes {dtypes}:"
            " run viasd-profile for this pair and thread count"
        )
    return best


# ----------------------------------------------------------------------------- method=auto
DRAFTER_QUANTIZATIONS = ("int8-weight",)  # the drafter variants `auto` weighs beside the plain draft


def chosen_draft_variant(draft: str, target: str, dtype: str, draft_dtype: str, device: str = "cpu",
                         profile_path: str | None = None, acceptance: float = 0.6, k_max: int = 8,
                         context: int = 256) -> str:
    """The drafter the latency profile chooses for this target precision at this thread count:
    `draft_dtype` or one of its quantised variants. Where no drafting pays (the choice is AR), the
    cheapest draft, which `profiled_draft_length` then leaves idle (K = 0) until acceptance rises."""
    try:
        profile = load_profile(profile_path, device)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"method=auto runs what this machine's latency profile chooses: {error}") from error
    threads = torch.get_num_threads()
    variants = [v for v in (draft_dtype, *(f"{draft_dtype}+{q}" for q in DRAFTER_QUANTIZATIONS))
                if profile.has(draft, v, threads)]
    if not variants:
        raise KeyError(f"the latency profile has no entry for the draft {draft} in {draft_dtype} at {threads}"
                       " thread(s): run viasd-profile for this pair")
    choice = choose_configuration(profile, draft, target, acceptance, threads, dtypes=[dtype],
                                  draft_dtypes=variants, k_max=k_max, context=context)
    if choice.framework == "sd":
        return choice.draft_dtype
    return min(variants, key=lambda v: profile.ms(draft, v, threads, 1, context))


class ProfiledDrafter(ModelDrafter):
    """A `ModelDrafter` of `model` running the variant `chosen_draft_variant` picks."""

    def __init__(self, model, draft: str, target: str, dtype: str, draft_dtype: str, device: str = "cpu",
                 profile_path: str | None = None, **drafter_settings):
        variant = chosen_draft_variant(draft, target, dtype, draft_dtype, device, profile_path)
        super().__init__(model, quantize=split_variant(variant)[1], **drafter_settings)


def profiled_draft_length(draft: str, target: str, dtype: str, draft_dtype: str, device: str = "cpu",
                          profile_path: str | None = None, k_min: int = 0, **schedule_settings):
    """`AdaptiveDraftLength` on the chosen drafter's costs; K may be 0 (a greedy AR step) where
    no block pays at the acceptance observed."""
    variant = chosen_draft_variant(draft, target, dtype, draft_dtype, device, profile_path)
    return AdaptiveDraftLength.from_profile(draft, target, dtype, variant, profile_path=profile_path, device=device,
                                            k_min=k_min, **schedule_settings)
