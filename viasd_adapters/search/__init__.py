"""DIMR: the offline search for a routing mask (random search, then hyperopt TPE)."""

from ..costs import attention_share  # the share that prices sub-block budgets (re-exported for the search CLIs)
from .calibration import CalibrationConfig, CalibrationSet, CalibrationText, PromptSource, build_calibration
from .dimr import SearchConfig, SearchResult, TrialRecord, run_search
from .greedy import GreedyStep, Sensitivity, greedy_removal, sensitivity
from .objective import EvaluationStore, ExpectedCost, MaskMetrics, MaskObjective, Reference, block_outcomes
from .report import Baselines, write_report
from .space import Budget, MaskSpace
from .target import CalibratedTarget, prepare_target

__all__ = [
    "Baselines",
    "Budget",
    "CalibratedTarget",
    "CalibrationConfig",
    "CalibrationSet",
    "CalibrationText",
    "EvaluationStore",
    "ExpectedCost",
    "GreedyStep",
    "MaskMetrics",
    "MaskObjective",
    "MaskSpace",
    "PromptSource",
    "Reference",
    "SearchConfig",
    "SearchResult",
    "Sensitivity",
    "TrialRecord",
    "attention_share",
    "block_outcomes",
    "build_calibration",
    "greedy_removal",
    "prepare_target",
    "run_search",
    "sensitivity",
    "write_report",
]
