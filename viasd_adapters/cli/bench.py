"""`viasd-bench`: run the configured methods on one task's prompts and write records,
tables and plots (see docs/results/benchmark.md)."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from ..bench import plots
from ..bench.harness import BenchSettings, Harness, Method, read_appended
from ..bench.report import ablation, build_report
from ..checks import check_config
from ..hardware import cpu_info, device_label
from ..models.precision import runtime_precision
from ..pipeline import build_decoder, load_pair, uses_draft_model
from . import apply_routing_file, entry_point, set_threads

logger = logging.getLogger(__name__)

RECORDS = "records.jsonl"


@dataclass
class BenchOutcome:
    out_dir: Path  # holds records.jsonl, table.md, summary.json, meta.json, config.yaml, *.png
    records: list[dict]  # as written to records.jsonl
    table: str  # the Markdown report


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "viasd-adapters")
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def run(cfg: DictConfig) -> BenchOutcome:
    """Load the pair once, build every method's decoder around it, run, report.

    Everything that can be checked without a model (methods, settings, the task's prompts) is
    checked before `out_dir` is touched, so a bad prompt file leaves nothing behind.
    """
    check_config(cfg)
    started = datetime.datetime.now()
    run_id = started.strftime("%Y-%m-%d_%H-%M-%S")
    _check_methods(cfg)
    apply_routing_file(cfg)
    settings = _settings(cfg)
    task = instantiate(cfg.task, _convert_="all")
    num_prompts = len(task.prompts())  # reads and validates the prompt file; the harness reads it again
    sampling = instantiate(cfg.sampling)

    out_dir, kept = _out_dir(cfg, run_id)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    set_threads(cfg.runtime.threads)
    logger.info("task %s: %d prompts from %s", task.name, num_prompts, getattr(task, "prompts_file", task.name))

    begin = time.perf_counter()
    pair, methods = _load_methods(cfg)
    load_seconds = time.perf_counter() - begin

    harness = Harness(methods, pair.target, task, sampling, settings, _context(cfg, run_id))
    begin = time.perf_counter()
    records = kept + _run_into(harness, out_dir / RECORDS, kept)
    bench_seconds = time.perf_counter() - begin

    table = _write_tables(cfg, out_dir, harness, records)
    meta = _meta(cfg, started, harness, records, load_seconds, bench_seconds)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    logger.info("wrote %d records and the report to %s", len(records), out_dir)
    return BenchOutcome(out_dir, records, table)


def _check_methods(cfg: DictConfig) -> None:
    if not cfg.method:
        raise ValueError("no method to run: pass method=[ar,sd,...] (files in conf/method/)")
    if cfg.baseline not in cfg.method:  # the harness checks it too, but only after the models load
        raise ValueError(
            f"the baseline method {cfg.baseline!r} is not among the methods {list(cfg.method)}:"
            f" add it (method=[{','.join([cfg.baseline, *cfg.method])}]) or set baseline=<one of them>"
        )
    if cfg.get("ablation"):
        named = [
            cfg.ablation.reference,
            *cfg.ablation.levers,
            *([cfg.ablation.combined] if cfg.ablation.get("combined") else []),
        ]
        if missing := [m for m in named if m not in cfg.method]:
            raise ValueError(f"ablation names methods {missing} that are not in method=[...]: add them")


def _settings(cfg: DictConfig) -> BenchSettings:
    return BenchSettings(
        repetitions=cfg.repetitions,
        warmup=cfg.warmup,
        max_new_tokens=cfg.max_new_tokens,
        chat_template=cfg.chat_template,
        baseline=cfg.baseline,
        host=cfg.host,
        roles=OmegaConf.to_container(cfg.roles),
        progress=cfg.progress,
        shard=cfg.shard,
        shards=cfg.shards,
    )


# Keys a resumed run may change: where and how it reports, not what it measures.
RESUMABLE_CHANGES = ("resume", "progress", "plots")


def _out_dir(cfg: DictConfig, run_id: str) -> tuple[Path, list[dict]]:
    """The run directory, and the records a resumed run keeps: those of the (prompt, repetition)
    groups its records.jsonl holds whole (a group cut short is dropped, and runs again)."""
    out_dir = Path(cfg.out_dir or f"outputs/bench/{run_id}")
    path = out_dir / RECORDS
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir, []
    if not cfg.resume:
        raise ValueError(f"{path} exists already: pick a fresh out_dir, or resume=true to continue that run")
    _check_same_run(cfg, out_dir / "config.yaml")
    records = read_appended(path)
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["prompt_id"], record["rep"]), []).append(record)
    kept = [r for group in groups.values() if len(group) == len(cfg.method) for r in group]
    logger.info(
        "resuming %s: %d whole prompt groups kept, %d records dropped",
        out_dir,
        len(kept) // len(cfg.method),
        len(records) - len(kept),
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)  # the kept records, whole, before anything is appended
    return out_dir, kept


def _check_same_run(cfg: DictConfig, saved: Path) -> None:
    """A resumed run must measure what it started measuring: its settings, bar `RESUMABLE_CHANGES`."""
    if not saved.is_file():
        raise ValueError(f"{saved} is missing: this directory was not written by viasd-bench; pick a fresh out_dir")
    before = OmegaConf.to_container(OmegaConf.load(saved))
    now = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(cfg, resolve=True)))
    changed = sorted(k for k in set(before) | set(now) if k not in RESUMABLE_CHANGES and before.get(k) != now.get(k))
    if changed:
        raise ValueError(
            f"resume=true continues the run in {saved.parent}, but {', '.join(changed)} differ from its config.yaml:"
            " run with the same settings, or pick a fresh out_dir"
        )


def _load_methods(cfg: DictConfig) -> tuple:
    """The model pair (the draft only if a method needs it) and every method's decoder on it."""
    needs_draft = any(uses_draft_model(m.framework.drafter, m.verifier) for m in cfg.method.values())
    pair = load_pair(cfg.model_pair, with_draft=needs_draft)
    methods = [
        Method(name, build_decoder(m.framework, m.verifier, pair), threads=m.get("threads"), kind=m.framework.name)
        for name, m in cfg.method.items()
    ]
    return pair, methods


def _context(cfg: DictConfig, run_id: str) -> dict:
    return {
        "run_id": run_id,
        "model_pair": cfg.model_pair.name,
        "dtype": runtime_precision(cfg.runtime).label,  # the latency profile's names (models.precision)
        "draft_dtype": runtime_precision(cfg.runtime, draft=True).label,
        "device": cfg.runtime.device,
        "hardware": device_label(cfg.runtime.device),  # CPU model, instruction sets, cores (or the GPU)
    }


def _run_into(harness: Harness, path: Path, kept: list[dict]) -> list[dict]:
    """Run the harness but for the groups `kept` holds, appending each record to `path` as it finishes."""
    skip = frozenset((r["prompt_id"], r["rep"]) for r in kept)
    with path.open("a", encoding="utf-8") as f:

        def sink(record: dict) -> None:
            f.write(json.dumps(record) + "\n")
            f.flush()

        return harness.run(sink, skip)


def _write_tables(cfg: DictConfig, out_dir: Path, harness: Harness, records: list[dict]) -> str:
    """table.md, summary.json and the plots; returns the Markdown table."""
    title = f"{harness.task.name} on {cfg.model_pair.name} ({runtime_precision(cfg.runtime)}, {harness.context['hardware']})"
    table, summary = build_report(records, harness.settings.baseline, harness.settings.host, title)
    if cfg.get("ablation"):
        spec = cfg.ablation
        text, rows = ablation(records, spec.reference, list(spec.levers), spec.get("combined"))
        table += f"\n### Ablation: each lever against {spec.reference}\n\n{text}\n\nGains are medians of paired ratios; shares are each lever's log-gain over the combination's.\n"
        summary["ablation"] = rows
    if harness.skipped:
        table += f"\nSkipped (longer than the context window): {', '.join(harness.skipped)}.\n"
    (out_dir / "table.md").write_text(table)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if cfg.plots:
        plots.speedup_vs_quality(records, out_dir / "speedup_quality.png")
        plots.tier_shares(records, out_dir / "tier_shares.png")
    return table


def _meta(
    cfg: DictConfig,
    started: datetime.datetime,
    harness: Harness,
    records: list[dict],
    load_seconds: float,
    bench_seconds: float,
) -> dict:
    task = harness.task
    return {
        "run_id": harness.context["run_id"],
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "model_pair": cfg.model_pair.name,
        "methods": list(cfg.method),
        "task": task.name,
        "prompts_file": getattr(task, "prompts_file", None),
        "load_seconds": load_seconds,
        "bench_seconds": bench_seconds,
        "records": len(records),
        "skipped_prompts": harness.skipped,  # longer than the target's context window
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_info().to_dict(),  # model name, instruction sets (AMX / AVX-512 / AVX2), cores
            "hardware": harness.context["hardware"],
            "torch_threads": torch.get_num_threads(),  # the process default; methods may set their own
            "method_threads": {m.name: m.threads for m in harness.methods},
        },
        "versions": _versions(),
    }


@entry_point("bench")
def main(cfg: DictConfig) -> None:
    if cfg.out_dir is None:
        with open_dict(cfg):
            cfg.out_dir = HydraConfig.get().runtime.output_dir
    outcome = run(cfg)
    print(outcome.table)
    print(f"records, table and plots: {outcome.out_dir}")


if __name__ == "__main__":
    main()
