"""The benchmark loop: every method on every prompt, interleaved, one record per generation.

Order of work (one process, models loaded once, every decoder sharing them):

1. warm-up: each method decodes the `warmup` shortest prompts once; nothing is recorded;
2. for each repetition r, for each prompt i, every method decodes the prompt, in the
   configured order rotated by (i + r) positions, so that machine drift and cache effects hit
   every method alike and no method always runs first;
3. once all methods have decoded a prompt, its records get the paired fields (speedup and
   agreement against the baseline method's generation of the same prompt and repetition, and
   speedup against the baseline's kind run at the same number of cores) and are handed to the
   sink (the JSONL file), so an interrupted run keeps what it finished.

Speed is the measured wall time of `Decoder.generate` (prefill included), never a model. Each
record states the cores its method occupied (torch threads summed over its processes, a
draft worker's included) and the CPU time it really used (this process and its children), so
a method that runs on two cores is only ever compared with a baseline allowed two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..decode import Decoder, GenerationResult
from ..models import LoadedModel
from ..pipeline import encode_prompt
from ..sampling import SamplingConfig
from .metrics import QUALITY_METRICS, Score, check_execution_enabled, token_agreement
from .resources import ResourceProbe
from .tasks import Prompt, Task

logger = logging.getLogger(__name__)


@dataclass
class Method:
    """A named decoder under test."""

    name: str  # its key in records and tables (e.g. "ar", "sd", "ar-2t")
    decoder: Decoder
    threads: int | None = None  # torch threads while it decodes; None: the process's setting
    kind: str | None = (
        None  # its framework ("ar", "sd", ...); methods of the baseline's kind are baselines at their cores
    )

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"method {self.name!r}: threads must be >= 1 or null, got {self.threads}")


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run the body with `threads` torch intra-op threads (None: as they are), then restore."""
    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)


@dataclass
class BenchSettings:
    """How the methods are run and compared."""

    repetitions: int = 3  # timed generations of every (method, prompt)
    warmup: int = 1  # shortest prompts each method decodes untimed before the first record
    max_new_tokens: int = 64  # per generation, unless the task sets its own
    chat_template: bool = True  # wrap prompts in the target's chat template when it has one
    baseline: str = "ar"  # speedups and agreement are measured against this method
    host: str | None = "sd"  # a second speed reference (the host framework without tiers)
    roles: dict[str, str] = field(default_factory=lambda: {"full": "target", "slim": "slim"})
    progress: bool = True  # show a tqdm bar
    shard: int = 0  # this job runs the task's prompts shard, shard + shards, shard + 2 shards, ...
    shards: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.shard < self.shards:
            raise ValueError(f"need 0 <= shard < shards, got shard={self.shard}, shards={self.shards}")
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.roles = dict(self.roles)
        if "full" not in self.roles:
            raise ValueError("roles must name the full model's model_calls key, e.g. roles.full=target")


def read_appended(path: Path) -> list[dict]:
    """The records of a JSONL file a run appends to, one per line. Only the last line can have been
    cut mid-write by a killed run: it is dropped (its prompt group runs again); any other bad
    line is an error."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number < len(lines):
                raise ValueError(f"{path}:{number} is not a JSON record: pick a fresh out_dir") from err
    return records


def rotated(methods: list[Method], shift: int) -> list[Method]:
    shift %= len(methods)
    return methods[shift:] + methods[:shift]


class Harness:
    """Runs `methods` on the prompts of `task`; see the module docstring for the order."""

    def __init__(
        self,
        methods: list[Method],
        target: LoadedModel,
        task: Task,
        sampling: SamplingConfig,
        settings: BenchSettings,
        context: dict | None = None,
    ):
        """`context`: fields copied into every record first (run id, model pair, dtype...)."""
        names = [m.name for m in methods]
        if len(set(names)) != len(names):
            raise ValueError(f"method names must be unique, got {names}")
        if settings.baseline not in names:
            raise ValueError(
                f"the baseline method {settings.baseline!r} is not among the methods {names}:"
                f" add it (method=[{','.join([settings.baseline, *names])}]) or set baseline=<one of them>"
            )
        if settings.host is not None and settings.host not in names:
            logger.warning("host method %r is not among %s: no speedup against it", settings.host, names)
            settings = dataclasses.replace(settings, host=None)
        self.methods = methods
        self.target = target
        self.task = task
        self.sampling = sampling
        self.settings = settings
        self.context = dict(context or {})
        self.probe = ResourceProbe(target.model.device)
        base = next(m for m in methods if m.name == settings.baseline)
        self.baseline_kind = base.kind or base.name
        self._scores: dict[tuple[str, str, str], Score] = {}
        self.skipped: list[str] = []  # ids of prompts that do not fit the context window

    @property
    def max_new_tokens(self) -> int:
        return self.task.max_new_tokens or self.settings.max_new_tokens

    def _generate(self, method: Method, ids: torch.Tensor, sampling: SamplingConfig) -> GenerationResult:
        with torch_threads(method.threads):
            return method.decoder.generate(ids, self.max_new_tokens, sampling, self.target.stop_token_ids)

    def _cores(self, method: Method) -> dict:
        with torch_threads(method.threads) as threads:
            return {"threads": threads, "cores": method.decoder.cores(threads)}

    def run(self, sink: Callable[[dict], None] = lambda record: None, skip: frozenset = frozenset()) -> list[dict]:
        """Run everything but the (prompt id, repetition) groups in `skip` (a resumed run's); each
        finished record goes to `sink` and into the returned list, a prompt's records together."""
        shard = self.task.prompts()[self.settings.shard :: self.settings.shards]
        prompts, encoded = self._encode(shard)
        if "pass@1" in self.task.metrics.values():
            check_execution_enabled()  # fail before the decoding, not after it
        R, P, M = self.settings.repetitions, len(prompts), len(self.methods)
        logger.info("task %s: %d prompts x %d methods x %d repetitions", self.task.name, P, M, R)

        # 1. warm-up on the shortest prompts: it settles allocators and kernels, cheaply
        for ids in sorted(encoded, key=lambda x: x.shape[1])[: self.settings.warmup]:
            for method in self.methods:
                self._generate(method, ids, self.sampling)

        records: list[dict] = []
        bar = tqdm(total=R * P * M, desc=f"bench {self.task.name}", unit="gen", disable=not self.settings.progress)
        with bar:
            for r in range(R):
                sampling = dataclasses.replace(self.sampling, seed=self.sampling.seed + r)
                for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
                    if (prompt.id, r) in skip:
                        bar.update(M)
                        continue
                    # 2. every method on this prompt, in an order rotated per prompt and repetition
                    done: dict[str, tuple[int, GenerationResult, dict]] = {}
                    for slot, method in enumerate(rotated(self.methods, i + r)):
                        self.probe.start()
                        result = self._generate(method, ids, sampling)
                        done[method.name] = (slot, result, {**self.probe.stop(), **self._cores(method)})
                        bar.set_postfix_str(f"{method.name} {result.stats.tokens_per_second:.2f} tok/s")
                        bar.update()
                    # 3. records in the configured order, paired with the baseline's, then written
                    group = [self._record(prompt, ids, r, m, *done[m.name]) for m in self.methods]
                    self._pair(group)
                    for record in group:
                        sink(record)
                    records.extend(group)
        return records

    def _encode(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[torch.Tensor]]:
        """[1, T] ids of each prompt; prompts that fill the context window are skipped."""
        kept, encoded, self.skipped = [], [], []
        limit = self.target.context_length
        for prompt in prompts:
            ids = encode_prompt(self.target, prompt.text, self.settings.chat_template)
            if ids.shape[1] >= limit:
                self.skipped.append(prompt.id)
                continue
            kept.append(prompt)
            encoded.append(ids)
        if self.skipped:
            logger.warning(
                "skipped %d prompt(s) longer than the target's context window (%d tokens): %s",
                len(self.skipped),
                limit,
                self.skipped,
            )
        if not kept:
            raise ValueError(f"every prompt of task {self.task.name!r} is longer than the context window ({limit})")
        return kept, encoded

    def _score(self, prompt: Prompt, text: str) -> tuple[str | None, Score]:
        metric = self.task.metric_for(prompt.category)
        if metric is None:
            return None, Score(None)
        key = (metric, prompt.id, text)  # identical outputs (lossless methods) are scored once
        if key not in self._scores:
            self._scores[key] = QUALITY_METRICS[metric](prompt, text)
        return metric, self._scores[key]

    def _record(
        self,
        prompt: Prompt,
        ids: torch.Tensor,
        rep: int,
        method: Method,
        slot: int,
        result: GenerationResult,
        resources: dict,
    ) -> dict:
        stats = result.stats
        n = stats.new_tokens
        text = self.target.tokenizer.decode(result.tokens, skip_special_tokens=True)
        metric, score = self._score(prompt, text)
        decided = sum(stats.tier_counts.values())
        calls = {name: c.calls for name, c in stats.model_calls.items()}
        roles = self.settings.roles
        return {
            **self.context,
            "time": datetime.datetime.now().isoformat(timespec="seconds"),
            "task": self.task.name,
            "category": prompt.category,
            "subcategory": prompt.subcategory,
            "prompt_id": prompt.id,
            "rep": rep,
            "slot": slot,  # position in this prompt's method order (0 ran first)
            "method": method.name,
            "kind": method.kind or method.name,
            "prompt_tokens": int(ids.shape[1]),
            "max_new_tokens": self.max_new_tokens,
            "new_tokens": n,
            "seconds": stats.seconds,
            "tokens_per_second": stats.tokens_per_second,
            "steps": stats.steps,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "mean_accepted_length": stats.mean_accepted_length,
            "acceptance_rate": stats.acceptance_rate if stats.drafted else None,
            "per_token_acceptance": stats.per_token_acceptance if stats.drafted else None,
            "rejection_rate": stats.rejection_rate if stats.drafted else None,
            "tier_counts": dict(stats.tier_counts),
            "settled_blocks": stats.settled,  # rounds the slim tier settled without the full model
            "tier_shares": {t: c / decided for t, c in stats.tier_counts.items()} if decided else {},
            "model_calls": {name: dataclasses.asdict(c) for name, c in stats.model_calls.items()},
            "calls_per_token": {name: c / n if n else None for name, c in calls.items()},
            **self._cost_per_token(stats),
            "full_calls_per_token": calls.get(roles["full"], 0) / n if n else None,
            "slim_calls_per_token": calls.get(roles.get("slim", ""), 0) / n if n else None,
            "quality_metric": metric,
            "quality": score.value,
            "quality_detail": score.detail,
            **resources,
            "cpu_seconds_per_token": resources["cpu_seconds"] / n if n else None,
            "output_tokens": list(result.tokens),
            "output_text": text,
        }

    def _cost_per_token(self, stats) -> dict[str, float | None]:
        """Wall ms per generated token: all of it, inside each role's forwards (target, slim,
        draft: every other model), and the rest (overhead: drafting and verifying logic, sampling,
        cache bookkeeping, waiting for a worker). Forwards of a draft worker run at the same time
        as the target's, so for PEARL the parts can add up to more than the whole."""
        n = stats.new_tokens
        parts = {"target": 0.0, "slim": 0.0, "draft": 0.0}
        full, slim = self.settings.roles["full"], self.settings.roles.get("slim")
        for name, calls in stats.model_calls.items():
            role = "target" if name == full else "slim" if name == slim else "draft"
            parts[role] += 1000.0 * calls.seconds / n if n else 0.0
        wall = 1000.0 * stats.seconds / n if n else None
        out = {f"{role}_ms_per_token": value if n else None for role, value in parts.items()}
        out["ms_per_token"] = wall
        out["overhead_ms_per_token"] = max(wall - sum(parts.values()), 0.0) if n else None
        return out

    def _pair(self, group: list[dict]) -> None:
        """Fill the fields that compare each record with the baseline's (and host's) record, and
        with the record of the baseline's kind at the same cores (None when the run has none)."""
        by_name = {record["method"]: record for record in group}
        base = by_name[self.settings.baseline]
        host = by_name.get(self.settings.host) if self.settings.host else None
        by_cores: dict[int, dict] = {}
        for record in group:  # the first of the baseline's kind at each core count (the named baseline first)
            if record["kind"] == self.baseline_kind:
                by_cores.setdefault(record["cores"], record)
        by_cores[base["cores"]] = base
        for record in group:
            same = by_cores.get(record["cores"])
            record["baseline_same_cores"] = same["method"] if same else None
            record["speedup_same_cores"] = (
                _ratio(record["tokens_per_second"], same["tokens_per_second"]) if same else None
            )
            # What the forwards alone would allow: the baseline's ms/token over this record's
            # forward ms/token, i.e. the speedup with zero overhead.
            forwards = sum(record[f"{role}_ms_per_token"] or 0.0 for role in ("target", "slim", "draft"))
            record["speedup_bound_no_overhead"] = (
                _ratio(same["ms_per_token"], forwards) if same and same["ms_per_token"] else None
            )
            match, exact = token_agreement(record["output_tokens"], base["output_tokens"])
            record["baseline"] = self.settings.baseline
            record["speedup_vs_baseline"] = _ratio(record["tokens_per_second"], base["tokens_per_second"])
            record["token_match_vs_baseline"] = match
            record["exact_match_vs_baseline"] = float(exact)
            record["host"] = self.settings.host
            record["speedup_vs_host"] = _ratio(record["tokens_per_second"], host["tokens_per_second"]) if host else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None
