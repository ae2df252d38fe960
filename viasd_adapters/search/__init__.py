"""DIMR: the offline search for a routing mask (random search, then hyperopt TPE)."""

from .calibration import CalibrationConfig, CalibrationSet, CalibrationText, PromptSource, build_calibration
from .dimr import SearchConfig, SearchResult, TrialRecord, run_search
from .greedy import GreedyStep, Sensitivity, greedy_removal, sensitivity
from .objective import EvaluationStore, MaskMetrics, MaskObjective, Reference
from .report import Baselines, write_report
from .session import Session, open_session
from .space import Budget, MaskSpace, attention_share

__all__ = [
    "Baselines",
    "Budget",
    "CalibrationConfig",
    "CalibrationSet",
    "CalibrationText",
    "EvaluationStore",
    "GreedyStep",
    "MaskMetrics",
    "MaskObjective",
    "MaskSpace",
    "PromptSource",
    "Reference",
    "SearchConfig",
    "SearchResult",
    "Session",
    "TrialRecord",
    "attention_share",
    "build_calibration",
    "greedy_removal",
    "open_session",
    "run_search",
    "sensitivity",
    "write_report",
]
