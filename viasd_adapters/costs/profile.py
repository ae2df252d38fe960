"""The device's latency profile: milliseconds per forward pass, measured once and cached.

A profile is a list of entries, one per measured configuration:

    model, dtype, threads, context (tokens already cached; 0: a prefill from an empty cache),
    new_tokens (tokens fed), layers (None: the whole model; a slim view's layers run otherwise)
    ->  ms (median), ms_min, repeats

It is measured by `viasd-profile`, `viasd-costmodel mode=profile` or `costs.measure_profile`, and
cached as JSON (by default `$VIASD_CACHE/profiles/<cpu slug>.json`, ~/.cache/viasd-adapters/
profiles/), with the CPU, torch version and device it was measured with and each model's decoder
layers. Entries are keyed, so a later measurement (more models, another dtype, slim views) merges
into the same file instead of replacing it. `LatencyProfile.draft_costs` turns a draft/target
pair into the cost ratios of Leviathan's formula (`viasd_adapters.decode.schedule`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..decode.schedule import DraftCosts
from ..hardware import cpu_info
from ..models.offline import cache_root

logger = logging.getLogger(__name__)

# Bump when an entry's meaning changes; older files are then measured again. 2: int8 steps on the
# int8 GEMV (models.int8_gemv), up to 1.5x faster than the fbgemm steps format 1 recorded; 3: int8
# verify blocks of 3-4 rows on the GEMV too; 4: one-token steps of compiled models through the
# native operators and Inductor's C++ wrapper (models.native), about 10 % faster on a Zen 3; 5: the
# one-token layer as an AOTInductor package (models.packaged), 12-17 % faster again.
FORMAT = 5


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
class DraftVariant:
    """A drafter as the profile names it (`label`): its load dtype, a quantised copy of it and a
    reduced LM head, what `ModelDrafter(quantize=..., vocabulary=...)` runs.

    "int8" is the plain draft; "bfloat16+int8-weight" its int8-weight copy of a bf16 load;
    "int8@qwen2.5-coder-0.5b-instruct-32768" the int8 draft scoring only that draft vocabulary's ids.
    """

    dtype: str
    quantization: str | None = None
    vocabulary: str | None = None  # a shipped draft vocabulary's name or a JSON file (models/vocab)

    @classmethod
    def parse(cls, label: str) -> DraftVariant:
        rest, _, vocabulary = label.partition("@")  # the dtype never holds "@"; a vocabulary's path may
        dtype, _, quantization = rest.partition("+")
        return cls(dtype, quantization or None, vocabulary or None)

    @property
    def label(self) -> str:
        quantization = f"+{self.quantization}" if self.quantization else ""
        return f"{self.dtype}{quantization}" + (f"@{self.vocabulary}" if self.vocabulary else "")

    def acceptance(self, plain: float, variant_acceptance: Mapping[str, float] | None) -> float:
        """This drafter's per-token acceptance: `variant_acceptance` holds the measured a of the
        variants that propose otherwise than the plain draft, keyed by what they change ("vocabulary",
        "int4", "int4+vocabulary"); `plain` for the rest (a copy that rounds alike, "int8-weight")."""
        given = variant_acceptance or {}
        changes = [*([self.quantization] if self.quantization else []), *(["vocabulary"] if self.vocabulary else [])]
        for key in ("+".join(changes), "vocabulary" if self.vocabulary else None):
            if key in given:
                return float(given[key])
        return plain


def draft_head_key(target: str, head: str) -> str:
    """The model name entries of an EAGLE head's tree level over `target` have (`time_draft_head`)."""
    return f"{target}+eagle:{Path(str(head)).name}"


@dataclass(frozen=True)
class LatencyEntry:
    """One measured forward configuration."""

    model: str  # model name (a ModelSpec name)
    dtype: str  # float32 | bfloat16 | float16, or a drafter's variant (`DraftVariant.label`)
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
    torch_version: str = torch.__version__  # the torch that measured it (kernels change between versions)
    created: str = ""  # ISO time of the measurement (UTC)
    entries: list[LatencyEntry] = field(default_factory=list)  # the measured forwards
    format: int = FORMAT  # the file format it was written in
    loadavg_1m: list[float] = field(default_factory=list)  # machine load at the start and end of the measurement
    model_layers: dict[str, int] = field(default_factory=dict)  # decoder layers (L) of each measured model

    # -- lookup -----------------------------------------------------------------------------
    def entries_of(self, model: str, dtype: str, threads: int) -> list[LatencyEntry]:
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
            return any(e.layers == layers for e in self.entries_of(model, dtype, threads))
        except KeyError:
            return False

    def ms(
        self, model: str, dtype: str, threads: int, new_tokens: int, context: int = 256, layers: float | None = None
    ) -> float:
        """Milliseconds of one forward: the measured context nearest to `context`, linear in
        `new_tokens` between measured counts (extended by the last step beyond them)."""
        found = [e for e in self.entries_of(model, dtype, threads) if e.layers == layers]
        if not found:
            raise KeyError(
                f"the latency profile has no entry for {model} in {dtype} at {threads} thread(s) running"
                f" {'all' if layers is None else f'{layers:g}'} layers: measure it with viasd-profile (whole models)"
                " or viasd-costmodel mode=profile (slim views)"
            )
        points = sorted((e.new_tokens, e.ms) for e in at_context(found, context))
        return _interpolate(points, new_tokens)

    def draft_costs(
        self,
        draft: str,
        target: str,
        dtype: str,
        draft_dtype: str,
        threads: int | None = None,
        context: int = 256,
        max_tokens: int = 17,
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
        return LatencyProfile(
            other.device,
            other.hardware,
            other.cpu,
            other.torch_version,
            other.created,
            list(entries.values()),
            loadavg_1m=self.loadavg_1m + other.loadavg_1m,
            model_layers={**self.model_layers, **other.model_layers},
        )

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


def at_context(entries: list[LatencyEntry], context: int) -> list[LatencyEntry]:
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
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a readable profile ({err}): delete it and run viasd-profile again") from err
    if "entries" not in data:  # e.g. the fitted lines an older viasd-costmodel wrote
        raise ValueError(
            f"{path} holds no measured entries (an older profile format): measure it again with"
            " viasd-profile, or viasd-costmodel mode=profile"
        )
    profile = LatencyProfile.from_dict(data)
    if profile.format != FORMAT:
        raise ValueError(
            f"{path} has profile format {profile.format}, this version reads {FORMAT}: run viasd-profile again"
        )
    if profile.torch_version != torch.__version__:
        logger.warning(
            "%s was measured with torch %s, this is %s: run viasd-profile again if kernels changed",
            path,
            profile.torch_version,
            torch.__version__,
        )
    return profile
