"""What forwards cost on this device, and the choices made from it.

* `timing`: the one timing loop (`time_forwards`; a mask's slim/full ratio, `measure_cost_ratio`);
* `profile`: the latency profile, ms per measured forward, cached per machine (`LatencyProfile`);
* `measure`: the grid of configurations a profile measures, and the measurement (`measure_profile`);
* `model`: the cost model fitted to a profile, ms as a line in tokens fed and layers run (`CostModel`);
* `tree`: the draft tree worth verifying, from acceptance by depth and rank and the costs (`shape_tree`);
* `choice`: the fastest configuration by the profile (`choose_configuration`);
* `auto`: the decoding parts built from it (`ProfiledDrafter`, draft-length schedules);
* `breakeven`: what a slim tier must cost or settle for VIA-SD to beat its host.
"""

from .auto import (
    DRAFTER_QUANTIZATIONS,
    ProfiledDecoder,
    ProfiledDrafter,
    adaptive_draft_length,
    chosen_draft_variant,
    profiled_draft_length,
)
from .breakeven import settled_share_needed, slim_ratio_needed
from .choice import Choice, EagleCandidate, choose_configuration, eagle_candidate, winnable_dtypes
from .measure import (
    ProfileGrid,
    measure_draft_head,
    measure_for_choice,
    measure_missing,
    measure_pair,
    measure_profile,
    missing_points,
    usable_threads,
)
from .model import ROLES, CostModel, Line, attention_share, fit_line
from .profile import (
    FORMAT,
    DraftVariant,
    LatencyEntry,
    LatencyProfile,
    default_profile_path,
    draft_head_key,
    load_profile,
    profile_dir,
)
from .timing import CostRatio, measure_cost_ratio, time_draft_head, time_forwards
from .tree import TreeShape, profiled_tree, shape_tree

__all__ = [
    "DRAFTER_QUANTIZATIONS",
    "FORMAT",
    "ROLES",
    "Choice",
    "CostModel",
    "CostRatio",
    "DraftVariant",
    "EagleCandidate",
    "LatencyEntry",
    "LatencyProfile",
    "Line",
    "ProfileGrid",
    "ProfiledDecoder",
    "ProfiledDrafter",
    "TreeShape",
    "adaptive_draft_length",
    "attention_share",
    "choose_configuration",
    "chosen_draft_variant",
    "default_profile_path",
    "draft_head_key",
    "eagle_candidate",
    "fit_line",
    "load_profile",
    "measure_cost_ratio",
    "measure_draft_head",
    "measure_for_choice",
    "measure_missing",
    "measure_pair",
    "measure_profile",
    "missing_points",
    "profile_dir",
    "profiled_draft_length",
    "profiled_tree",
    "settled_share_needed",
    "shape_tree",
    "slim_ratio_needed",
    "time_draft_head",
    "time_forwards",
    "usable_threads",
    "winnable_dtypes",
]
