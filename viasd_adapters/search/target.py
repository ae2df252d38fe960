"""A target with its calibration text, full-model reference and memoised objective: what both
`viasd-search` and `viasd-eval-mask` start from."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..models import LoadedModel
from .calibration import CalibrationConfig, CalibrationSet, build_calibration
from .objective import EvaluationStore, ExpectedCost, MaskObjective, Reference

logger = logging.getLogger(__name__)


@dataclass
class CalibratedTarget:
    loaded: LoadedModel
    calibration: CalibrationSet
    reference: Reference
    objective: MaskObjective  # memoised; every new evaluation is appended to the store
    store: EvaluationStore

    @property
    def model_name(self) -> str:
        return Path(self.loaded.spec.name).name

    @property
    def num_layers(self) -> int:
        return self.reference.num_layers


def prepare_target(
    loaded: LoadedModel,
    calibration: CalibrationConfig,
    cache_dir: str | Path | None,
    progress: bool = True,
    expected: ExpectedCost | None = None,
) -> CalibratedTarget:
    """Calibration text (cached), the full model's reference (computed once), the objective
    (with `expected`, it also prices each mask for the cost-aware search)."""
    texts = build_calibration(loaded, calibration, cache_dir, progress)
    logger.info(
        "%s split: %d texts, %d tokens, %d scored positions",
        calibration.split,
        len(texts.texts),
        texts.num_tokens,
        texts.num_scored,
    )
    reference = Reference(loaded.model, texts, progress)
    store_path = None
    if cache_dir:
        store_path = Path(cache_dir).expanduser() / "evaluations" / f"{Path(loaded.spec.name).name}-{texts.key}.jsonl"
    store = EvaluationStore(store_path)
    objective = store.attach(MaskObjective(reference, expected))
    if objective.memo:
        logger.info("%d mask evaluations read from %s", len(objective.memo), store_path)
    return CalibratedTarget(loaded, texts, reference, objective, store)
