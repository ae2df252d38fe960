"""The device's latency profile: milliseconds per forward pass, measured once and cached.

A profile is a list of entries, one per measured configuration:

    model, dtype, threads, context (tokens already cached), new_tokens (tokens fed), layers
    (None: the whole model; a slim view's layer count otherwise)  ->  ms (median), ms_min, repeats

It is measured by `viasd-profile` (or `measure_profile`) and cached as JSON in
`$VIASD_CACHE/profiles/<cpu slug>.json` (default ~/.cache/viasd-adapters/profiles/), with the CPU,
torch version and device it was measured with. Entries are keyed, so a later measurement (more
models, another dtype, slim views with `layers` set) merges into the same file instead of
replacing it.

What reads it: `LatencyProfile.draft_costs` turns a draft/target pair into the cost ratios of
Leviathan's formula (`viasd_adapters.decode.schedule`), and `choose_configuration` picks the
target dtype, draft dtype and draft length with the highest expected tokens per second.
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

import torch

from .decode.schedule import DraftCosts, best_draft_length, expected_speedup
from .hardware import cpu_info, device_label, synchronize

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when an entry's meaning changes; older files are then measured again


def profile_dir() -> Path:
    root = os.environ.get("VIASD_CACHE") or Path.home() / ".cache" / "viasd-adapters"
    return Path(root) / "profiles"


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
    layers: int | None = None  # decoder layers run (None: all of them; set for slim views)

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

    # -- lookup -----------------------------------------------------------------------------
    def _matching(self, model: str, dtype: str, threads: int, layers: int | None) -> list[LatencyEntry]:
        if torch.device(self.device).type != "cpu":  # an accelerator's speed does not depend on CPU threads
            return [e for e in self.entries if (e.model, e.dtype, e.layers) == (model, dtype, layers)]
        return [e for e in self.entries if (e.model, e.dtype, e.threads, e.layers) == (model, dtype, threads, layers)]

    def has(self, model: str, dtype: str, threads: int, layers: int | None = None) -> bool:
        return bool(self._matching(model, dtype, threads, layers))

    def ms(self, model: str, dtype: str, threads: int, new_tokens: int, context: int = 256, layers: int | None = None) -> float:
        """Milliseconds of one forward: the measured context nearest to `context`, linear in
        `new_tokens` between measured counts (extended by the last step beyond them)."""
        found = self._matching(model, dtype, threads, layers)
        if not found:
            have = sorted({(e.model, e.dtype, e.threads) for e in self.entries})
            raise KeyError(
                f"the latency profile has no entry for {model} in {dtype} at {threads} thread(s)"
                f" (layers {layers}); it has {have}: run viasd-profile with that model, dtype and threads"
            )
        nearest = min({e.context for e in found}, key=lambda c: (abs(c - context), c))
        points = sorted((e.new_tokens, e.ms) for e in found if e.context == nearest)
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
                              list(entries.values()), loadavg_1m=self.loadavg_1m + other.loadavg_1m)

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
    profile = LatencyProfile.from_dict(json.loads(path.read_text()))
    if profile.format != FORMAT:
        raise ValueError(f"{path} has profile format {profile.format}, this version reads {FORMAT}: run viasd-profile again")
    if profile.torch_version != torch.__version__:
        logger.warning("%s was measured with torch %s, this is %s: run viasd-profile again if kernels changed",
                       path, profile.torch_version, torch.__version__)
    return profile


# -- measuring -----------------------------------------------------------------------------

@torch.no_grad()
def time_forwards(model: torch.nn.Module, context: int, new_tokens: Iterable[int], repeats: int, seed: int = 0) -> dict[int, list[float]]:
    """Milliseconds of each of `repeats` forwards per count in `new_tokens`, after `context`
    cached tokens (random ids: the cost of a dense forward does not depend on the text).

    Works for any module with a causal-LM forward (a slim view of a target too). The cache is
    cropped back to `context` before each forward, as a rejected draft block is; every forward
    keeps the logits of all the tokens it is fed, as a verify does.
    """
    from transformers import DynamicCache

    counts = list(new_tokens)
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(vocab, (1, context), generator=gen).to(device)
    times: dict[int, list[float]] = {n: [] for n in counts}
    cache = DynamicCache()
    if context:
        model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
    for r in range(repeats + 1):  # repeat 0 warms the kernels up for every shape
        for n in counts:
            ids = torch.randint(vocab, (1, n), generator=gen).to(device)
            if context:
                cache.crop(context)
            else:
                cache = DynamicCache()
            synchronize(device)
            begin = time.perf_counter()
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=n)
            synchronize(device)
            if r:
                times[n].append(1000.0 * (time.perf_counter() - begin))
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
        if min(self.new_tokens) < 1 or min(self.threads) < 1 or min(self.contexts) < 0 or self.repeats < 1:
            raise ValueError("new_tokens and threads must be >= 1, contexts >= 0, repeats >= 1")
        self.models, self.dtypes = list(dict.fromkeys(self.models)), list(dict.fromkeys(self.dtypes))
        self.variants, self.variant_models = list(dict.fromkeys(self.variants)), list(dict.fromkeys(self.variant_models))
        self.threads = sorted({int(t) for t in self.threads})
        self.new_tokens = sorted({int(n) for n in self.new_tokens})
        self.contexts = sorted({int(c) for c in self.contexts})

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
) -> LatencyProfile:
    """Measure every point of `grid`; `load(name, dtype, device)` returns a model (default: the
    project's model zoo). Each model is loaded once per dtype (a variant: its load dtype, then
    quantised as a drafter quantises it) and freed before the next."""
    from tqdm.auto import tqdm

    from .models.quantize import quantized_copy

    load = load or _load_from_zoo
    saved = torch.get_num_threads()
    load_start = os.getloadavg()[0]
    threads = usable_threads(grid.threads, device)
    if threads != grid.threads:
        logger.warning("profiling threads %s of %s: this machine has %d cores", threads, grid.threads, cpu_info().logical_cores)
    entries = []
    bar = tqdm(total=len(grid.combinations()) * len(threads) * len(grid.contexts),
               desc="latency profile", unit="point", disable=not progress)
    try:
        for name, dtype in grid.combinations():
            load_dtype, quantization = split_variant(dtype)
            model = load(name, load_dtype, device)
            if quantization:
                model = quantized_copy(model, quantization)
            for t in threads:
                torch.set_num_threads(t)
                for context in grid.contexts:
                    bar.set_postfix_str(f"{name} {dtype} {t}t ctx {context}")
                    for n, ms in time_forwards(model, context, grid.new_tokens, grid.repeats).items():
                        entries.append(LatencyEntry(name, dtype, t, context, n, statistics.median(ms), min(ms), len(ms)))
                    bar.update()
            del model
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
    )


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
        threads=grid.threads, new_tokens=grid.new_tokens, contexts=grid.contexts, repeats=grid.repeats,
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
        fastest_ar = max(ar_speeds.values())
        for dtype, ar in ar_speeds.items():
            options = [Choice("ar", dtype, None, 0, ar / fastest_ar, ar, fastest_ar, t, acceptance)]
            for draft_dtype in drafts:
                costs = profile.draft_costs(draft, target, dtype, draft_dtype, t, context, k_max + 1)
                k = best_draft_length(acceptance, costs, k_max)
                speed = expected_speedup(acceptance, k, costs) * ar
                options.append(Choice("sd", dtype, draft_dtype, k, speed / fastest_ar, speed, fastest_ar, t, acceptance))
            for option in options:
                if best is None or option.expected_tokens_per_second > best.expected_tokens_per_second:
                    best = option
    if best is None:
        raise ValueError(
            f"the profile lacks {target} at thread count(s) {threads} in the dtypes {dtypes}:"
            " run viasd-profile for this pair and thread count"
        )
    return best
