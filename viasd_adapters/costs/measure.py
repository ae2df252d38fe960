"""Measuring a latency profile: the grid of configurations, what a cached profile lacks of it,
and the measurement itself (every point timed with `costs.timing.time_forwards`)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..draft import ModelDrafter
from ..draft.model import FOUR_BIT, QUANTIZE_OPTIONS
from ..hardware import cpu_info, device_label
from ..models import LoadedModel, ModelSpec, load_model
from ..models.precision import INT8, Precision
from ..routing import RoutingMask, decoding_view
from .choice import winnable_dtypes
from .model import attention_share
from .profile import DraftVariant, LatencyEntry, LatencyProfile, draft_head_key
from .timing import time_draft_head, time_forwards

logger = logging.getLogger(__name__)


@dataclass
class ProfileGrid:
    """What `measure_profile` measures (Hydra-instantiable: conf/profile.yaml).

    Every model in every dtype, and the `variant_models` (drafters) also in each of `variants`
    (`DraftVariant` labels: a quantised copy, "<dtype>+<quantization>", what `ModelDrafter(quantize=...)`
    runs) and, given a `draft_vocabulary`, with that reduced LM head in each of `vocabulary_dtypes`
    ("<dtype>@<vocabulary>", what `ModelDrafter(vocabulary=...)` runs).
    """

    models: list[str]  # ModelSpec names
    dtypes: list[str] = field(default_factory=lambda: ["bfloat16", "float32"])  # every model is measured in each
    variants: list[str] = field(default_factory=list)  # e.g. ["bfloat16+int8-weight"]
    variant_models: list[str] = field(default_factory=list)  # the models measured in `variants` too
    draft_vocabulary: str | None = None  # a draft vocabulary (models/vocab) the variant_models are timed with too
    vocabulary_dtypes: list[str] = field(default_factory=lambda: ["int8"])  # ... in these of `dtypes` or variants
    threads: list[int] | None = None  # clipped to the cores there are; None: the cores there are
    new_tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 5, 8, 12])  # per forward: conf/profile.yaml
    contexts: list[int] = field(default_factory=lambda: [128, 512])  # tokens cached before each forward
    prefill: list[int] = field(default_factory=list)  # prompt lengths also timed from an empty cache (context 0)
    repeats: int = 3  # timed forwards per point (one more warms up)

    def __post_init__(self) -> None:
        if not self.models and not self.variant_models:
            raise ValueError("name at least one model to profile (models=[...])")
        if self.draft_vocabulary:
            reduced = (
                dataclasses.replace(DraftVariant.parse(d), vocabulary=self.draft_vocabulary)
                for d in self.vocabulary_dtypes
            )
            self.variants = [*self.variants, *(v.label for v in reduced if v.dtype in self.dtypes)]
        if bool(self.variants) != bool(self.variant_models):
            raise ValueError(
                "variants and variant_models go together: name the drafter variants (or a draft_vocabulary)"
                " and the models measured in them, or neither"
            )
        for variant in map(DraftVariant.parse, self.variants):
            head_only = variant.quantization is None and variant.vocabulary is not None
            if not head_only and variant.quantization not in QUANTIZE_OPTIONS:
                raise ValueError(
                    f"variant {variant.label!r} is not <dtype>+<quantization> with a quantization of"
                    f" {list(QUANTIZE_OPTIONS)}, e.g. bfloat16+int8-weight or int8+int4, or <dtype>@<draft vocabulary>"
                )
            if variant.quantization == FOUR_BIT and variant.dtype != INT8:
                raise ValueError(f"variant {variant.label!r}: 4-bit steps are made from an int8 draft: int8+{FOUR_BIT}")
        if self.threads is None:
            self.threads = [cpu_info().logical_cores]
        for name in ("dtypes", "threads", "new_tokens", "contexts"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if (
            min(self.new_tokens + self.prefill) < 1
            or min(self.threads) < 1
            or min(self.contexts) < 0
            or self.repeats < 1
        ):
            raise ValueError("new_tokens, prefill and threads must be >= 1, contexts >= 0, repeats >= 1")
        self.models, self.dtypes = list(dict.fromkeys(self.models)), list(dict.fromkeys(self.dtypes))
        self.variants, self.variant_models = (
            list(dict.fromkeys(self.variants)),
            list(dict.fromkeys(self.variant_models)),
        )
        self.threads = sorted({int(t) for t in self.threads})
        self.new_tokens = sorted({int(n) for n in self.new_tokens})
        self.contexts = sorted({int(c) for c in self.contexts})
        self.prefill = sorted({int(n) for n in self.prefill})

    def combinations(self) -> list[tuple[str, str]]:
        """(model, dtype or variant) pairs, each loaded once."""
        return [(m, d) for m in self.models for d in self.dtypes] + [
            (m, v) for m in self.variant_models for v in self.variants
        ]

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
    masks: dict[str, list[RoutingMask]] | None = None,
) -> LatencyProfile:
    """Measure every point of `grid`; `load(name, dtype, device)` returns a model (default: the
    project's model zoo). Each model is loaded once per dtype (a variant: its load dtype, then
    quantised as a drafter quantises it) and freed before the next; a draft over a draft
    vocabulary takes turns with the plain draft it shares weights with.

    `masks`: model name -> `RoutingMask`s whose slim views of it are timed beside it (plain
    dtypes, decode-sized forwards), taking turns with the whole model: the cost model's layer
    dimension."""
    load = load or (lambda *args: _load_from_zoo(*args).model)
    masks = masks or {}
    saved = torch.get_num_threads()
    load_start = os.getloadavg()[0]
    threads = usable_threads(grid.threads, device)
    if threads != grid.threads:
        logger.warning(
            "profiling threads %s of %s: this machine has %d cores", threads, grid.threads, cpu_info().logical_cores
        )
    entries, layers = [], {}
    # (context, counts, whether slim views are timed too): prefill is priced on the whole model only
    shapes = [(c, grid.new_tokens, True) for c in grid.contexts] + ([(0, grid.prefill, False)] if grid.prefill else [])
    loads = _loads(grid.combinations())
    bar = tqdm(
        total=len(loads) * len(threads) * len(shapes), desc="latency profile", unit="point", disable=not progress
    )
    try:
        for (name, dtype), derived in loads.items():
            variant = DraftVariant.parse(dtype)
            model = load(name, variant.dtype, device)
            _check_window(model, name, grid)
            layers[name] = int(model.config.num_hidden_layers)
            if variant.quantization or variant.vocabulary:  # timed as the drafter runs it
                views: dict = {(dtype, None): _drafter_runner(model, variant)}
            else:
                views = {(dtype, key): view for key, view in _slim_views(model, masks.get(name, ())).items()}
                views[dtype, None] = model
                for label in derived:  # taking turns with the plain model: drift hits both alike
                    views[label, None] = _drafter_runner(model, DraftVariant.parse(label))
            whole = {key: view for key, view in views.items() if key[1] is None}
            for t in threads:
                torch.set_num_threads(t)
                for context, counts, slim in shapes:
                    bar.set_postfix_str(f"{name} {dtype} {t}t ctx {context}")
                    for (label, key), row in time_forwards(
                        views if slim else whole, context, counts, grid.repeats
                    ).items():
                        entries += [
                            LatencyEntry(name, label, t, context, n, statistics.median(ms), min(ms), len(ms), key)
                            for n, ms in row.items()
                        ]
                    bar.update()
            del model, views, whole
    finally:
        torch.set_num_threads(saved)
        bar.close()
    return LatencyProfile(
        device=str(device),
        hardware=device_label(device),
        cpu=cpu_info().to_dict(),
        torch_version=torch.__version__,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        entries=entries,
        loadavg_1m=[load_start, os.getloadavg()[0]],
        model_layers=layers,
    )


def _drafter_runner(model: torch.nn.Module, variant: DraftVariant):
    """The runner of `variant` over the loaded `model`, as `ModelDrafter` runs it."""
    return ModelDrafter(model, quantize=variant.quantization, vocabulary=variant.vocabulary).runner


def _loads(combinations: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """{(model, dtype or variant) to load: the variants timed with its weights as loaded}. A drafter
    variant ("int8@<vocabulary>", "int8+int4", "bfloat16+int8-weight") shares its load dtype's load,
    where that is measured too, and takes turns with it: c, a draft's step over the target's, then
    compares steps timed side by side, not in loads minutes apart on a drifting machine."""
    planned = set(combinations)
    loads: dict[tuple[str, str], list[str]] = {}
    for name, dtype in combinations:
        variant = DraftVariant.parse(dtype)
        if dtype != variant.dtype and (name, variant.dtype) in planned:
            loads.setdefault((name, variant.dtype), []).append(dtype)
        else:
            loads.setdefault((name, dtype), [])
    return loads


def _check_window(model: torch.nn.Module, name: str, grid: ProfileGrid) -> None:
    window = int(model.config.max_position_embeddings)
    longest = max(max(grid.contexts) + max(grid.new_tokens), max(grid.prefill, default=0))
    if longest > window:
        raise ValueError(
            f"the grid's longest forward ({longest} tokens: contexts + new_tokens, or prefill) does not"
            f" fit {name}'s window of {window} tokens"
        )


def _slim_views(model: torch.nn.Module, masks) -> dict[float, torch.nn.Module]:
    """{layers run: slim view} of `model` per mask (masks of equal depth price alike: one is timed)."""
    if not masks:
        return {}
    L, share = int(model.config.num_hidden_layers), attention_share(model)
    return {float(L - mask.skipped_cost(share)): decoding_view(model, mask) for mask in masks}


def measure_pair(
    pair,
    masks: list[RoutingMask],
    contexts: list[int],
    new_tokens: list[int],
    prefill: list[int],
    repeats: int,
    quantizations: list[str] = (),
    progress: bool = False,
) -> LatencyProfile:
    """The profile a cost model needs of a loaded pair (`pipeline.ModelPair`), at this process's
    torch threads: the target whole and as the slim view of each mask, the draft in its dtype and
    in each of `quantizations` (the variants its drafter may run, e.g. "int8-weight")."""
    loaded = {m.spec.name: m for m in (pair.target, pair.draft) if m is not None}
    profile = None
    for name, m in loaded.items():
        is_draft = pair.draft is not None and name == pair.draft.spec.name
        variants = [f"{m.spec.precision.label}+{q}" for q in quantizations] if is_draft else []
        grid = ProfileGrid(
            models=[name],
            dtypes=[m.spec.precision.label],
            variants=variants,
            variant_models=[name] if variants else [],
            threads=[torch.get_num_threads()],
            new_tokens=new_tokens,
            contexts=contexts,
            prefill=prefill,
            repeats=repeats,
        )
        fresh = measure_profile(
            grid,
            m.spec.device,
            lambda *_, model=m.model: model,
            progress,
            {name: masks} if name == pair.target.spec.name else None,
        )
        profile = fresh if profile is None else profile.merge(fresh)
    return profile


def _load_from_zoo(name: str, precision: str, device: str) -> LoadedModel:
    """`name` from the model zoo in the precision the profile labels `precision`."""
    return load_model(ModelSpec(name=name, **Precision.from_label(precision).settings(), device=device))


def missing_points(profile: LatencyProfile | None, grid: ProfileGrid, device: str = "cpu") -> ProfileGrid | None:
    """The part of `grid` (whole models x dtypes, each with all of `grid`'s forwards) that `profile`
    lacks any point of at the thread counts this machine can run; None if nothing."""
    if profile is None:
        return grid
    threads = usable_threads(grid.threads, device)
    wanted = {(c, n) for c in grid.contexts for n in grid.new_tokens} | {(0, n) for n in grid.prefill}

    def complete(model: str, dtype: str, t: int) -> bool:
        try:
            measured = {(e.context, e.new_tokens) for e in profile.entries_of(model, dtype, t) if e.layers is None}
        except KeyError:
            return False
        return wanted <= measured

    need = [(m, d) for m, d in grid.combinations() if not all(complete(m, d, t) for t in threads)]
    if not need:
        return None
    plain = [(m, d) for m, d in need if d in grid.dtypes]
    variants = [(m, d) for m, d in need if d not in grid.dtypes]
    return ProfileGrid(
        models=sorted({m for m, _ in plain}, key=grid.models.index),
        dtypes=sorted({d for _, d in plain}, key=grid.dtypes.index) or grid.dtypes,
        variants=sorted({d for _, d in variants}, key=grid.variants.index),
        variant_models=sorted({m for m, _ in variants}, key=grid.variant_models.index),
        threads=grid.threads,
        new_tokens=grid.new_tokens,
        contexts=grid.contexts,
        prefill=grid.prefill,
        repeats=grid.repeats,
    )


def measure_missing(
    profile: LatencyProfile | None,
    grid: ProfileGrid,
    device: str = "cpu",
    load: Callable[[str, str, str], torch.nn.Module] | None = None,
    progress: bool = True,
) -> LatencyProfile | None:
    """`profile` with whatever part of `grid` it lacks measured and merged in."""
    todo = missing_points(profile, grid, device)
    if todo is None:
        return profile
    logger.info("measuring the latency profile: %d model x dtype x threads x context points", todo.points)
    fresh = measure_profile(todo, device, load, progress=progress)
    return profile.merge(fresh) if profile else fresh


def measure_for_choice(
    profile: LatencyProfile | None,
    grid: ProfileGrid,
    draft: str,
    target: str,
    acceptance: float,
    context: int,
    device: str = "cpu",
    load: Callable[[str, str, str], torch.nn.Module] | None = None,
    progress: bool = True,
) -> tuple[LatencyProfile, list[str]]:
    """What `choose_configuration` needs of `grid` for the pair, measured where `profile` lacks it,
    and the target precisions it may choose among.

    First every model's one-token step in every precision of `grid`: all a draft is priced by, and
    the bound of `winnable_dtypes`. Then the target's multi-token forwards, only in the precisions
    that bound leaves: a precision whose step is several times the fastest one's is never timed further.
    """
    steps = dataclasses.replace(grid, new_tokens=[1], prefill=[])
    profile = measure_missing(profile, steps, device, load, progress)
    threads = usable_threads(grid.threads, device)
    winnable = {d for t in threads for d in winnable_dtypes(profile, target, grid.dtypes, acceptance, t, context)}
    kept = [d for d in grid.dtypes if d in winnable]
    for dtype in sorted(set(grid.dtypes) - set(kept), key=grid.dtypes.index):
        logger.info(
            "%s in %s cannot be the fastest at acceptance %.2f: its one-token step exceeds 1/(1 - a) times the"
            " fastest one; its verify costs are not measured",
            target,
            dtype,
            acceptance,
        )
    verifies = ProfileGrid(
        models=[target],
        dtypes=kept,
        threads=grid.threads,
        new_tokens=grid.new_tokens,
        contexts=grid.contexts,
        repeats=grid.repeats,
    )
    return measure_missing(profile, verifies, device, load, progress), kept


def measure_draft_head(
    profile: LatencyProfile,
    target: str,
    head: str,
    dtypes: list[str],
    grid: ProfileGrid,
    context: int,
    vocabulary: str | None = None,
    device: str = "cpu",
    load: Callable[[str, str, str], LoadedModel] | None = None,
    progress: bool = True,
) -> LatencyProfile:
    """`profile` with the EAGLE `head`'s tree level timed over `target` in each of `dtypes` (as
    `EagleDecoder` runs it: int8 on an int8 target, over the draft `vocabulary` when given) for
    every count of `grid.new_tokens` as rows, at `context`, where `profile` lacks it.
    `load(name, dtype, device)`: the target with its tokenizer (default: the model zoo's)."""
    from ..hosts.eagle import EagleDecoder  # EAGLE is an optional extra

    key = draft_head_key(target, head)
    threads = usable_threads(grid.threads, device)
    todo = [d for d in dtypes if not all(profile.has(key, d, t) for t in threads)]
    if not todo:
        return profile
    load = load or _load_from_zoo
    saved, entries = torch.get_num_threads(), []
    bar = tqdm(total=len(todo) * len(threads), desc="EAGLE head", unit="point", disable=not progress)
    try:
        for dtype in todo:
            loaded = load(target, dtype, device)
            decoder = EagleDecoder(target=loaded.model, head=head, vocabulary=vocabulary, tokenizer=loaded.tokenizer)
            tiered = decoder.model
            lm_head = tiered.draft_head or tiered.base_model.lm_head
            for t in threads:
                torch.set_num_threads(t)
                for n, ms in time_draft_head(tiered.ea_layer, lm_head, context, grid.new_tokens, grid.repeats).items():
                    entries.append(LatencyEntry(key, dtype, t, context, n, statistics.median(ms), min(ms), len(ms)))
                bar.update()
            del decoder, tiered, loaded
    finally:
        torch.set_num_threads(saved)
        bar.close()
    return profile.merge(dataclasses.replace(profile, entries=entries))
