"""`viasd-frontier`: VIA-SD's operating points beside the cascades', on the same prompts, one run.

    viasd-frontier out_dir=outputs/frontier/run1              # every task of conf/frontier.yaml
    viasd-frontier out_dir=outputs/frontier/run1 only=[math]  # one task: a chunk; rerun resumes
    viasd-frontier out_dir=outputs/frontier/run1 report_only=true

Each task runs through the benchmark harness with every point of the sweep as a method
(interleaved per prompt, rotated order); its records go to records-<task>.jsonl as they finish.
A task whose records file is complete is skipped on a rerun; an incomplete one is redone. The
report (frontier.md, frontier.json, speed_quality.png, rejection_quality.png, and with a
latency profile costmodel.md) is rebuilt from every records file in out_dir after each run.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..bench import costmodel
from ..bench.frontier import (
    CASCADE_SD,
    FASTER_CASCADES,
    SweepConfig,
    build_points,
    comparison_table,
    frontier_plots,
    gated_point,
    matched_comparison,
    points_table,
    summarize,
)
from ..bench.harness import BenchSettings, Harness, Method, read_appended
from ..bench.tasks import Prompt, Task
from ..checks import check_config
from ..configs import load_routing
from ..costs import CostModel, attention_share, load_profile, measure_cost_ratio, measure_pair
from ..hardware import cpu_info
from ..models.precision import runtime_precision
from ..pipeline import build_decoder, encode_prompt, load_pair
from . import entry_point, set_threads

logger = logging.getLogger(__name__)


def _records_path(out_dir: Path, task_key: str) -> Path:
    return out_dir / f"records-{task_key}.jsonl"


def read_records(out_dir: Path) -> list[dict]:
    records = []
    for path in sorted(out_dir.glob("records-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def _subtitle(cfg: DictConfig, records: list[dict]) -> str:
    cpu = cpu_info().model
    threads = records[0].get("threads") if records else cfg.runtime.threads
    return (
        f"{cfg.model_pair.name}, {runtime_precision(cfg.runtime)}, greedy; {cpu}, {threads} torch threads for every"
        f" method; {len({(r['task'], r['prompt_id']) for r in records})} prompts, measured"
    )


def write_report(cfg: DictConfig, out_dir: Path, points) -> str:
    """Tables and plots from every records file in out_dir; returns the Markdown."""
    records = read_records(out_dir)
    if not records:
        raise ValueError(f"no records in {out_dir}: run the frontier first (without report_only)")
    costs_path = out_dir / "slim_costs.json"
    slim_costs = json.loads(costs_path.read_text()) if costs_path.is_file() else {}
    summaries = summarize(
        records, points, {k: v["ratio"] for k, v in slim_costs.items()}, cfg.roles.full, cfg.roles.slim
    )
    baseline = points[0].name
    hosts = tuple(p.family for p in points[1 : len(cfg.sweep.references)])  # VIA-SD's host, beside the cascades
    comparisons = matched_comparison(
        summaries, baseline, cfg.min_agreement, cfg.tolerance_points, rivals=(FASTER_CASCADES, CASCADE_SD) + hosts
    )
    tasks = sorted({r["task"] for r in records})
    text = [
        f"# Frontier: {cfg.model_pair.name}",
        "",
        _subtitle(cfg, records) + f"; tasks {', '.join(tasks)}; {len(records)} generations.",
        "",
        "## Every point",
        "",
        points_table(summaries, baseline, cfg.min_agreement, cfg.tolerance_points),
        "",
        f"Matched quality: agreement with {baseline} >= {cfg.min_agreement} and every task metric within"
        f" {cfg.tolerance_points:g} point(s) of {baseline}'s (metrics in points: BLEU 0-100, the others x100).",
        "",
        "## VIA-SD against each rival at matched quality",
        "",
        comparison_table(comparisons),
        "",
    ]
    if slim_costs:
        text += [
            "## Slim forward cost, measured (interleaved medians, one verify block)",
            "",
            "| mask | tokens | full ms | slim ms | slim / full |",
            "|---|---|---|---|---|",
        ]
        text += [
            f"| {k} | {v['new_tokens']} | {v['full_ms']:.1f} | {v['slim_ms']:.1f} | {v['ratio']:.3f} |"
            for k, v in slim_costs.items()
        ]
        text.append("")
    profile_path = out_dir / "profile.json"
    if profile_path.is_file():
        costs = costmodel.record_costs(
            load_profile(profile_path), cfg.model_pair.target.name, cfg.model_pair.draft.name, cfg.profile.context
        )
        text += costmodel_section(records, points, costs, baseline)
    markdown = "\n".join(text)
    (out_dir / "frontier.md").write_text(markdown)
    (out_dir / "frontier.json").write_text(
        json.dumps(
            {
                "points": [s.to_dict() for s in summaries],
                "comparisons": [
                    {
                        "rival": c.rival,
                        "via_sd": c.via_sd.name if c.via_sd else None,
                        "other": c.other.name if c.other else None,
                        "rejection_diff": c.rejection_diff,
                        "speed_diff": c.speed_diff,
                    }
                    for c in comparisons
                ],
            },
            indent=1,
        )
    )
    frontier_plots(summaries, out_dir, _subtitle(cfg, records), baseline)
    return markdown


def costmodel_section(records, points, costs, baseline: str) -> list[str]:
    """`costs`: record -> its cost model (`costmodel.record_costs`)."""
    slim = {p.name: p.slim_layers for p in points if p.slim_layers is not None}
    # A gated block goes to the whole target without a slim pass, and records do not separate those
    # forwards from escalations: a gated point's target forwards are priced whole (an upper bound).
    full = {p.name: p.full_layers for p in points if p.full_layers is not None and not p.verifier.get("gate")}
    predictions = costmodel.predict_records(records, costs, slim, baseline, full)
    measured = costs(records[0])
    text = [
        "## Cost model: predicted against measured (this CPU)",
        "",
        costmodel.validation_table(predictions, measured.device),
        "",
    ]
    modelled = [CostModel.synthetic(measured.num_layers, ratio) for ratio in (0.05, 0.1)]
    table = costmodel.modelled_speedups(records, modelled, slim, baseline, full)
    names = list(dict.fromkeys(r["method"] for r in records))
    text += [
        "## MODELLED, not measured: the same call counts on GPU-like cost ratios",
        "",
        "Speedup vs AR predicted from each point's measured forward counts, on devices described"
        " only by ratios: a draft step at 0.05 or 0.1 of a target step, a verify of a few tokens"
        " costing one step, a slim step costing its share of the target's layers (90 % of a step"
        " scales with depth).",
        "",
        "| point | " + " | ".join(table) + " |",
        "|---|" + "---|" * len(table),
    ]
    for name in names:
        text.append(f"| {name} | " + " | ".join(f"{table[d].get(name) or 0:.2f}" for d in table) + " |")
    text.append("")
    return text


def measure_costs(cfg: DictConfig, out_dir: Path, pair, routing: dict[str, DictConfig], context_ids) -> None:
    """slim_costs.json (slim / full ms per mask, one verify block) and profile.json, once per out_dir."""
    from ..routing import RoutingMask

    masks = {name: instantiate(node, _convert_="all") for name, node in routing.items()}
    costs_path = out_dir / "slim_costs.json"
    if not costs_path.is_file():
        costs = {}
        for name, mask in masks.items():
            assert isinstance(mask, RoutingMask)
            costs[name] = measure_cost_ratio(
                pair.target.model, mask, context_ids, int(cfg.profile.block_tokens), repetitions=7
            ).to_dict()
        costs_path.write_text(json.dumps(costs, indent=1))
    profile_path = out_dir / "profile.json"
    if not profile_path.is_file():
        shape = cfg.profile
        profile = measure_pair(
            pair,
            list(masks.values()),
            [shape.context],
            list(shape.tokens),
            list(shape.prefill),
            shape.repetitions,
            list(shape.quantizations),
        )
        profile.save(profile_path)


def calibrate_gates(cfg: DictConfig, out_dir: Path, pair, points) -> list:
    """A gated twin of each point, its threshold calibrated on calibration prompts (gates.json, once)."""
    from ..routing import RoutingMask
    from ..search.calibration import PromptSource, select_prompts
    from ..search.gate_calibration import calibrate_gate
    from ..search.objective import ExpectedCost

    path = out_dir / "gates.json"
    gates = json.loads(path.read_text()) if path.is_file() else {}
    target = pair.target.spec
    profile = CostModel.fit(
        load_profile(out_dir / "profile.json"), target.name, dtype=target.precision.label, context=cfg.profile.context
    )
    share = attention_share(pair.target.model)
    prompts = [
        encode_prompt(pair.target, text, cfg.chat_template)
        for source in cfg.gate.prompts.sources
        for _, text in select_prompts(PromptSource(**source), cfg.gate.prompts.split, cfg.gate.prompts.per_category)
    ]
    L = int(pair.target.model.config.num_hidden_layers)
    for point in points:
        if point.name not in gates:
            mask = instantiate(point.verifier.slim.mask, _convert_="all")
            assert isinstance(mask, RoutingMask)
            expected = ExpectedCost(
                profile,
                share,
                block=int(cfg.profile.block_tokens) - 1,  # K drafts + 1
                share_prefix=bool(point.verifier.get("share_prefix", False)),
            )
            slim_ratio, escalate_ratio = expected.ratios(mask, L)
            choice = calibrate_gate(
                pair, point.framework, point.verifier, prompts, cfg.gate.max_new_tokens, slim_ratio, escalate_ratio
            )
            gates[point.name] = asdict(choice) | {"slim_ratio": slim_ratio, "escalate_ratio": escalate_ratio}
            path.write_text(json.dumps(gates, indent=1))
    return [gated_point(p, gates[p.name]["min_confidence"]) for p in points]


def run(cfg: DictConfig) -> str:
    check_config(cfg)  # the base methods, runtime and budgets, before any model loads
    out_dir = Path(cfg.out_dir)
    sweep: SweepConfig = instantiate(cfg.sweep, _convert_="all")
    routing = load_routing(sweep.masks)
    settings = _settings(cfg, sweep)
    tasks, only = _checked_tasks(cfg)
    sampling = instantiate(cfg.sampling)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.report_only:
        return write_report(cfg, out_dir, _points_from_run(sweep, cfg, routing, out_dir))

    if not 0 <= int(cfg.shard) < int(cfg.shards):
        raise ValueError(f"need 0 <= shard < shards, got shard={cfg.shard}, shards={cfg.shards}")
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    set_threads(cfg.runtime.threads)
    pair = load_pair(cfg.model_pair, with_draft=True)
    points = build_points(sweep, cfg.method, routing, attention_share(pair.target.model))
    selected, needed = _selected(cfg, points, sweep)
    points = [p for p in points if p.name in needed]
    gated = [g for g in sweep.gated if f"{g}+gate" in selected]
    shard = (int(cfg.shard), int(cfg.shards))
    runs = sum(p.name in selected for p in points) + len(gated)  # records per prompt and repetition
    pending = {k: _remaining(out_dir, k, tasks[k], runs, cfg.repetitions, shard) for k in only}
    pending = {k: ids for k, ids in pending.items() if ids}
    if pending and cfg.measure_costs:
        first = tasks[next(iter(pending))]
        measure_costs(cfg, out_dir, pair, routing, _shortest_prompt(pair, first, cfg.chat_template))
    if gated:
        points += calibrate_gates(cfg, out_dir, pair, [p for p in points if p.name in gated])
    points = [p for p in points if p.name in selected]
    _write_points(out_dir, points)
    methods = [Method(p.name, build_decoder(p.framework, p.verifier, pair)) for p in points]
    if settings.baseline not in selected:  # a job of some points: speed and agreement against its first
        settings = replace(settings, baseline=points[0].name, host=None)
    ran = _run_pending(cfg, out_dir, pair, methods, tasks, pending, sampling, settings)
    meta = {
        "cpu": cpu_info().model,
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "points": len(points),
        "tasks": list(tasks),
        "ran": ran,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    return write_report(cfg, out_dir, points)


def _selected(cfg: DictConfig, points, sweep: SweepConfig) -> tuple[set[str], set[str]]:
    """The point names this invocation runs (`points`, checked against the sweep's; else all),
    and those it builds: a gated twin's gate is calibrated on its ungated point."""
    names = [p.name for p in points] + [f"{g}+gate" for g in sweep.gated]
    if not cfg.points:
        return set(names), set(names)
    if unknown := [n for n in cfg.points if n not in names]:
        raise ValueError(f"points={unknown}: not points of this sweep; its points are {names}")
    return set(cfg.points), set(cfg.points) | {n.removesuffix("+gate") for n in cfg.points}


def _settings(cfg: DictConfig, sweep: SweepConfig) -> BenchSettings:
    return BenchSettings(
        repetitions=cfg.repetitions,
        warmup=0,
        chat_template=cfg.chat_template,
        baseline=sweep.references[0],
        host=sweep.references[1] if len(sweep.references) > 1 else None,
        roles=OmegaConf.to_container(cfg.roles),
        progress=cfg.progress,
    )


def _checked_tasks(cfg: DictConfig) -> tuple[dict[str, Task], list[str]]:
    """Every task of the config and the keys this run may decode (`only`, narrowed to
    `prompt_ids` when set), their prompt files read and checked before any model loads."""
    tasks = {key: instantiate(node, _convert_="all") for key, node in cfg.tasks.items()}
    only = list(cfg.only) if cfg.only else list(tasks)
    unknown = [k for k in only if k not in tasks]
    if unknown:
        raise ValueError(f"only={unknown}: not tasks of this config ({list(tasks)})")
    for key in only:
        tasks[key].prompts()
    if cfg.prompt_ids:
        ids = [str(i) for i in cfg.prompt_ids]
        known = {p.id for key in only for p in tasks[key].prompts()}
        if missing := [i for i in ids if i not in known]:
            raise ValueError(f"prompt_ids={missing}: not prompts of the tasks {only}")
        tasks.update({key: _Subset(tasks[key], ids) for key in only})
    return tasks, only


def _shortest_prompt(pair, task: Task, chat_template) -> torch.Tensor:
    return min((encode_prompt(pair.target, p.text, chat_template) for p in task.prompts()), key=lambda x: x.shape[1])


def _write_points(out_dir: Path, points) -> None:
    """points.json: what a report-only run cannot rebuild without the model (the slim depths)."""
    (out_dir / "points.json").write_text(
        json.dumps(
            [
                {
                    "name": p.name,
                    "family": p.family,
                    "kind": p.kind,
                    "param": p.param,
                    "mask": p.mask,
                    "slim_layers": p.slim_layers,
                    "full_layers": p.full_layers,
                }
                for p in points
            ],
            indent=1,
        )
    )


def _run_pending(
    cfg: DictConfig,
    out_dir: Path,
    pair,
    methods: list[Method],
    tasks: dict[str, Task],
    pending: dict[str, list[str]],
    sampling,
    settings: BenchSettings,
) -> dict[str, list[str]]:
    """Decode the pending prompts of each task, at most `chunk_prompts` of them in all, appending
    to its records file; returns the ids decoded per task."""
    context = {
        "model_pair": cfg.model_pair.name,
        "dtype": runtime_precision(cfg.runtime).label,  # the latency profile's names (models.precision)
        "draft_dtype": runtime_precision(cfg.runtime, draft=True).label,
        "device": cfg.runtime.device,
        "cpu": cpu_info().model,
    }
    budget = int(cfg.chunk_prompts) if cfg.chunk_prompts else None  # prompts this invocation may decode
    ran = {}
    for key, ids in pending.items():
        if budget is not None and budget <= 0:
            break
        ids = ids[:budget] if budget is not None else ids
        task = _Subset(tasks[key], ids)
        if not ran:  # settle allocators and kernels for every point, untimed, once per process
            shortest = _shortest_prompt(pair, task, cfg.chat_template)
            for m in methods:
                m.decoder.generate(shortest, int(cfg.warmup_tokens), sampling, pair.target.stop_token_ids)
        begin = time.perf_counter()
        harness = Harness(
            methods,
            pair.target,
            task,
            sampling,
            BenchSettings(**{**asdict(settings), "max_new_tokens": task.max_new_tokens or 64}),
            context,
        )
        with _records_path(out_dir, key).open("a", encoding="utf-8") as f:
            harness.run(lambda record: (f.write(json.dumps(record) + "\n"), f.flush()))
        ran[key] = ids
        budget = None if budget is None else budget - len(ids)
        logger.info("task %s: prompts %s, %.0f s", key, ids, time.perf_counter() - begin)
    return ran


def _points_from_run(sweep: SweepConfig, cfg: DictConfig, routing, out_dir: Path):
    """The sweep's points without loading a model: the slim depth each ran is read from points.json."""
    points = build_points(sweep, cfg.method, routing)
    gates = out_dir / "gates.json"
    if sweep.gated and gates.is_file():
        chosen = json.loads(gates.read_text())
        points += [gated_point(p, chosen[p.name]["min_confidence"]) for p in points if p.name in chosen]
    saved = out_dir / "points.json"
    if saved.is_file():
        depth = {p["name"]: (p["slim_layers"], p.get("full_layers")) for p in json.loads(saved.read_text())}
        for p in points:
            p.slim_layers, p.full_layers = depth.get(p.name, (p.slim_layers, p.full_layers))
    return points


def _remaining(
    out_dir: Path, key: str, task, num_points: int, repetitions: int, shard: tuple[int, int] = (0, 1)
) -> list[str]:
    """Ids of the task's prompts of this (shard, shards) without a complete group of records (one
    per point and repetition): shard i of n holds prompts i, i + n, i + 2n, ...

    Records of incomplete groups (an interrupted run, or a sweep that changed) are dropped from
    the file, so a rerun decodes those prompts again for every point."""
    path = _records_path(out_dir, key)
    rows = read_appended(path) if path.is_file() else []
    count: dict[str, int] = {}
    for r in rows:
        count[r["prompt_id"]] = count.get(r["prompt_id"], 0) + 1
    done = {pid for pid, n in count.items() if n == num_points * repetitions}
    if len(done) != len(count):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["prompt_id"] in done))
    index, count_shards = shard
    return [p.id for p in task.prompts()[index::count_shards] if p.id not in done]


class _Subset(Task):
    """The prompts of `task` with the given ids (its metrics and budget)."""

    def __init__(self, task: Task, ids: list[str]):
        self.task, self.ids = task, set(ids)
        self.name, self.metrics, self.max_new_tokens = task.name, task.metrics, task.max_new_tokens

    def prompts(self) -> list[Prompt]:
        return [p for p in self.task.prompts() if p.id in self.ids]


@entry_point("frontier")
def main(cfg: DictConfig) -> None:
    print(run(cfg))


if __name__ == "__main__":
    main()
