"""`viasd-costmodel`: measure a device's latency profile, or predict a run's speed from its call counts.

    viasd-costmodel mode=profile out_dir=outputs/profile/cpu
    viasd-costmodel mode=predict records=outputs/frontier/run1 profile=outputs/profile/cpu/profile.json \
        out_dir=outputs/profile/cpu

`profile` times the pair's target (whole and under each routing mask: the layer dimension) and
draft (also as each quantised variant its drafter may run), decode-sized and prompt-sized
forwards, and writes profile.json (a latency profile, viasd_adapters/costs/profile.py) and profile.md
(its entries and the cost model fitted to them). `predict` prices every record's forward counts
with the cost model of the variants it ran (bench/costmodel.py), writes the predicted against
measured table, and the speedups the same counts give on modelled GPU-like devices, labelled as
modelled.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from ..bench import costmodel
from ..configs import load_routing
from ..costs import CostModel, LatencyProfile, load_profile, measure_pair
from ..pipeline import load_pair
from . import entry_point, set_threads

logger = logging.getLogger(__name__)


def _read_run(path: Path) -> tuple[list[dict], dict[str, float | str], dict[str, float]]:
    """Records of a frontier or bench run directory, and each method's slim and escalation depth (points.json)."""
    if not path.is_dir():
        raise ValueError(f"records={str(path)!r} is not a run directory of viasd-frontier or viasd-bench")
    files = sorted(path.glob("records-*.jsonl")) or sorted(path.glob("records.jsonl"))
    if not files:
        raise ValueError(f"{path} holds no records-*.jsonl or records.jsonl")
    records = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    slim: dict[str, float | str] = {}
    full: dict[str, float] = {}
    points = path / "points.json"
    if points.is_file():
        rows = json.loads(points.read_text())
        slim = {p["name"]: p["slim_layers"] for p in rows if p["slim_layers"] is not None}
        full = {p["name"]: p["full_layers"] for p in rows if p.get("full_layers") is not None}
    return records, slim, full


def profile_markdown(profile: LatencyProfile, fitted: dict[str, CostModel]) -> str:
    """The entries, then each drafter variant's fitted lines ({draft variant: cost model})."""
    lines = [
        f"# Latency profile: {profile.hardware}",
        "",
        f"torch {profile.torch_version}, {profile.created}",
        "",
        "| model | dtype | threads | layers run | tokens fed | context | ms (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {e.model} | {e.dtype} | {e.threads} | {'all' if e.layers is None else f'{e.layers:g}'} | {e.new_tokens}"
        f" | {e.context} | {e.ms:.1f} |"
        for e in profile.entries
    ]
    lines += [
        "",
        "Fitted: ms(n, l) = a + b l + (c + d l) n",
        "",
        "| draft variant | line | a | b | c | d |",
        "|---|---|---|---|---|---|",
    ]
    for variant, model in fitted.items():
        for kind, table in (("decode", model.decode), ("prefill", model.prefill)):
            lines += [
                f"| {variant} | {kind} {k} | {v.a:.2f} | {v.b:.3f} | {v.c:.3f} | {v.d:.4f} |" for k, v in table.items()
            ]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> Path:
    out_dir = Path(cfg.out_dir)
    if cfg.mode == "profile":
        masks = [instantiate(node, _convert_="all") for node in load_routing(list(cfg.masks)).values()]
        set_threads(cfg.runtime.threads)
        pair = load_pair(cfg.model_pair, with_draft=True)
        profile = measure_pair(
            pair, masks, [cfg.context], list(cfg.tokens), list(cfg.prefill), cfg.repetitions, list(cfg.quantizations)
        )
        profile.save(out_dir / "profile.json")
        draft_dtype = pair.draft.spec.precision.label
        fitted = {
            v: CostModel.fit(
                profile,
                pair.target.spec.name,
                pair.draft.spec.name,
                pair.target.spec.precision.label,
                v,
                context=cfg.context,
            )
            for v in [draft_dtype] + [f"{draft_dtype}+{q}" for q in cfg.quantizations]
        }
        (out_dir / "profile.md").write_text(profile_markdown(profile, fitted))
        return out_dir / "profile.md"
    if cfg.mode == "predict":
        if not cfg.records or not cfg.profile:
            raise ValueError("mode=predict needs records=RUN_DIR and profile=PATH/profile.json")
        profile = load_profile(cfg.profile)  # checked before reading any records
        records, slim, full = _read_run(Path(cfg.records))
        target = cfg.model_pair.target.name
        costs = costmodel.record_costs(profile, target, cfg.model_pair.draft.name, cfg.context)
        predictions = costmodel.predict_records(records, costs, slim, cfg.baseline, full)
        L = costs(records[0]).num_layers  # the target's depth (every record's cost model has it)
        modelled = [CostModel.synthetic(L, float(r)) for r in cfg.draft_ratios]
        table = costmodel.modelled_speedups(records, modelled, slim, cfg.baseline, full)
        text = [
            costmodel.validation_table(predictions, profile.hardware),
            "",
            "## MODELLED, not measured",
            "",
            "| method | " + " | ".join(table) + " |",
            "|---|" + "---|" * len(table),
        ]
        for name in dict.fromkeys(r["method"] for r in records):
            text.append(f"| {name} | " + " | ".join(f"{table[d].get(name) or 0:.2f}" for d in table) + " |")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "prediction.md").write_text("\n".join(text) + "\n")
        return out_dir / "prediction.md"
    raise ValueError(f"mode={cfg.mode!r}: use mode=profile or mode=predict")


@entry_point("costmodel")
def main(cfg: DictConfig) -> None:
    path = run(cfg)
    print(path.read_text())


if __name__ == "__main__":
    main()
