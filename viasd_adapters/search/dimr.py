"""DIMR: random search to seed, then hyperopt's TPE, over masks of one budget.

    result = run_search(objective, space, SearchConfig(num_random=16, num_tpe=48), trials_file=...)

Trials are pickled to `trials_file` after every trial; running again with the same file resumes
where the last run stopped (hyperopt's own `trials_save_file`). Any hyperopt `Trials` backend can
be passed instead (e.g. `hyperopt.SparkTrials` to run trials on a Spark cluster; the objective is
then pickled to the workers).
"""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from hyperopt import STATUS_OK, Trials, fmin, tpe
from hyperopt.fmin import generate_trials_to_calculate
from tqdm.auto import tqdm

from ..routing import RoutingMask
from .objective import MaskMetrics
from .space import MaskSpace

logger = logging.getLogger(__name__)

PHASES = ("seed", "random", "tpe")


@dataclass
class SearchConfig:
    """How many trials of each phase, and what they minimise."""

    num_random: int = 16  # random-search trials that seed TPE (uniform masks of the budget)
    num_tpe: int = 48  # TPE trials after them
    cost: str = "kl"  # "kl": mean KL(q || u); "disagreement": 1 - top-1 agreement; "expected": ExpectedCost
    seed: int = 0  # seeds hyperopt's generator: the same config and seed propose the same masks
    gamma: float = 0.25  # TPE: share of trials modelled as "good"
    num_candidates: int = 24  # TPE: candidates drawn per proposal (n_EI_candidates)

    def __post_init__(self) -> None:
        if self.num_random < 1 or self.num_tpe < 0:
            raise ValueError(f"need num_random >= 1 and num_tpe >= 0, got {self.num_random}, {self.num_tpe}")


@dataclass
class TrialRecord:
    """One trial: the mask TPE (or random search) proposed and what it cost."""

    number: int  # 0-based, in proposal order
    phase: str  # "seed" (a known mask), "random" or "tpe"
    mask: RoutingMask
    metrics: MaskMetrics
    loss: float  # metrics.cost(config.cost)


@dataclass
class SearchResult:
    trials: list[TrialRecord]
    config: SearchConfig
    seconds: float  # wall time of this run (a resumed search counts only its own part)
    evaluations: int  # masks evaluated by this run (the rest came from the memo or the store)
    resumed_from: int = 0  # trials already in the trials file when this run started
    extra: dict = field(default_factory=dict)

    @property
    def best(self) -> TrialRecord:
        return min(self.trials, key=lambda t: (t.loss, t.number))

    def best_so_far(self) -> list[float]:
        """Lowest loss after each trial."""
        return list(np.minimum.accumulate([t.loss for t in self.trials]))

    def of_phase(self, phase: str) -> list[TrialRecord]:
        return [t for t in self.trials if t.phase == phase]


class TrialFunction:
    """What hyperopt calls: scores -> mask -> metrics (picklable when the objective is)."""

    def __init__(self, objective, space: MaskSpace, cost: str, bar: tqdm | None = None):
        self.objective = objective
        self.space = space
        self.cost = cost
        self.bar = bar
        self.best: float | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "bar": None}

    def __call__(self, scores: dict) -> dict:
        mask = self.space.decode(scores)
        metrics = self.objective(mask)
        loss = metrics.cost(self.cost)
        if self.bar is not None:
            self.best = loss if self.best is None else min(self.best, loss)
            self.bar.update()
            self.bar.set_postfix_str(f"best {self.cost}={self.best:.4f} last {mask.describe()}")
        return {
            "loss": loss,
            "status": STATUS_OK,
            "skips": [list(s) for s in mask.skips],
            **metrics.to_dict(),
        }


def _phase(number: int, num_seeds: int, cfg: SearchConfig) -> str:
    if number < num_seeds:
        return "seed"
    return "random" if number < num_seeds + cfg.num_random else "tpe"


def run_search(
    objective,
    space: MaskSpace,
    cfg: SearchConfig,
    trials_file: str | Path | None = None,
    seeds: list[RoutingMask] = (),
    trials: Trials | None = None,
    progress: bool = True,
) -> SearchResult:
    """Minimise `cfg.cost` over `space`: `seeds`, then `cfg.num_random` random, then `cfg.num_tpe` TPE trials.

    `objective` maps a RoutingMask to MaskMetrics (e.g. a memoised `MaskObjective`).
    """
    seeds = list(seeds)
    total = len(seeds) + cfg.num_random + cfg.num_tpe
    path = Path(trials_file) if trials_file else None
    if trials is None:
        if path is not None and path.is_file():
            with open(path, "rb") as f:
                trials = pickle.load(f)
            logger.info("resuming from %s (%d trials done)", path, len(trials.trials))
        elif seeds:
            trials = generate_trials_to_calculate([space.encode(m) for m in seeds])
        else:
            trials = Trials()
    trials.refresh()  # trials queued by generate_trials_to_calculate are invisible until refreshed
    done = len([t for t in trials.trials if t["result"].get("status") == STATUS_OK])
    # Results of resumed trials seed the memo, so re-proposed masks cost nothing.
    if hasattr(objective, "remember"):
        for t in trials.trials:
            r = t["result"]
            if r.get("status") == STATUS_OK:
                objective.remember(RoutingMask(*r["skips"]), MaskMetrics.from_dict(r))
    before = getattr(objective, "evaluations", 0)
    begin = time.perf_counter()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=total, initial=done, desc=f"DIMR {space.budget.describe()}", disable=not progress) as bar:
        fn = TrialFunction(objective, space, cfg.cost, bar)
        if done < total:
            fmin(
                fn,
                space.hyperopt_space(),
                algo=partial(
                    tpe.suggest,
                    n_startup_jobs=len(seeds) + cfg.num_random,
                    gamma=cfg.gamma,
                    n_EI_candidates=cfg.num_candidates,
                ),
                max_evals=total,  # queued seeds count towards it
                trials=trials,
                rstate=np.random.default_rng(cfg.seed + done),
                show_progressbar=False,
                trials_save_file=str(path) if path is not None else "",
            )
    records = []
    for t in sorted(trials.trials, key=lambda t: t["tid"]):
        r = t["result"]
        if r.get("status") != STATUS_OK:
            continue
        mask = RoutingMask(*r["skips"], num_layers=space.num_layers, model=space.model)
        records.append(
            TrialRecord(len(records), _phase(len(records), len(seeds), cfg), mask, MaskMetrics.from_dict(r), r["loss"])
        )
    return SearchResult(
        records, cfg, time.perf_counter() - begin, getattr(objective, "evaluations", 0) - before, resumed_from=done
    )
