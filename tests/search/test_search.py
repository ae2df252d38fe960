import itertools

import numpy as np
import pytest

from viasd_adapters.routing import RoutingMask
from viasd_adapters.search import Budget, MaskMetrics, MaskSpace, SearchConfig, greedy_removal, run_search, sensitivity


class AdditiveObjective:
    """A stand-in objective: each skipped layer adds its weight, plus a penalty for adjacent pairs."""

    def __init__(self, weights, adjacent_penalty=0.0):
        self.weights = weights
        self.adjacent_penalty = adjacent_penalty
        self.memo = {}
        self.evaluations = 0

    def remember(self, mask, metrics):
        self.memo.setdefault(mask.skips, metrics)

    def __call__(self, mask: RoutingMask) -> MaskMetrics:
        if mask.skips not in self.memo:
            self.evaluations += 1
            s = mask.skip_layers
            kl = sum(self.weights[i] for i in s) + self.adjacent_penalty * sum(b - a == 1 for a, b in zip(s, s[1:]))
            kl += 0.3 * sum(self.weights[i] for i in mask.skip_mlp) + 0.1 * sum(
                self.weights[i] for i in mask.skip_attention
            )
            self.memo[mask.skips] = MaskMetrics(kl, float(np.exp(-kl)), 100)
        return self.memo[mask.skips]


WEIGHTS = [5.0, 0.9, 0.4, 0.3, 0.35, 0.5, 0.8, 2.0]


def test_space_decodes_exactly_the_budget():
    space = MaskSpace(8, Budget("layers", 3))
    rng = np.random.default_rng(0)
    for _ in range(20):
        mask = space.random_mask(rng)
        assert len(mask.skip_layers) == 3 and mask.is_layer_mask
    wanted = RoutingMask([2, 3, 4], num_layers=8)
    assert space.decode(space.encode(wanted)).skips == wanted.skips
    masks = space.random_masks(10, seed=1, exclude=[wanted])
    assert len({m.skips for m in masks}) == 10 and wanted.skips not in {m.skips for m in masks}
    with pytest.raises(ValueError, match="leaves none"):
        MaskSpace(4, Budget("layers", 4))
    with pytest.raises(ValueError, match="whole number"):
        Budget("layers", 2.5)


def test_block_budget_meets_cost_and_stays_valid():
    space = MaskSpace(4, Budget("blocks", 2.0), attn_share=0.2)
    rng = np.random.default_rng(0)
    for _ in range(50):
        mask = space.random_mask(rng)
        RoutingMask(*mask.skips, num_layers=4)  # valid
        assert mask.skipped_cost(0.2) >= 2.0 - 1e-9
        assert mask.skipped_cost(0.2) < 2.0 + 1.0  # never overshoots by a whole block more than needed
    # Scores that ask to skip every attention: the last one is passed over.
    scores = {label: (1.0 if label.startswith("a") else 0.0) for label in space.labels()}
    mask = space.decode(scores)
    assert len(mask.skip_attention) + len(mask.skip_layers) < 4


def test_greedy_removal_baseline():
    objective = AdditiveObjective(WEIGHTS, adjacent_penalty=0.2)
    path = greedy_removal(objective, 8, 3, progress=False)
    # With the adjacency penalty, greedy's second pick is 5 (0.5) over 4 (0.35 + 0.2), its third 2 (0.4 + 0.2).
    assert [s.mask.skip_layers for s in path] == [(3,), (3, 5), (2, 3, 5)]
    # Step 1 evaluates every layer; step j evaluates L - j candidates.
    assert [len(s.candidates) for s in path] == [8, 7, 6]
    best_pair = min(itertools.combinations(range(8), 2), key=lambda c: objective(RoutingMask(c)).kl)
    assert objective(RoutingMask(best_pair)).kl <= path[1].metrics.kl
    table = sensitivity(objective, 8, progress=False)
    assert [m.kl for m in table.layer] == WEIGHTS
    with pytest.raises(ValueError, match="steps"):
        greedy_removal(objective, 8, 8, progress=False)


def test_search_finds_the_best_mask_and_beats_random():
    objective = AdditiveObjective(WEIGHTS, adjacent_penalty=0.5)
    space = MaskSpace(8, Budget("layers", 3))
    result = run_search(objective, space, SearchConfig(num_random=10, num_tpe=40, seed=0), progress=False)
    optimum = min(itertools.combinations(range(8), 3), key=lambda c: objective(RoutingMask(c)).kl)
    assert result.best.mask.skip_layers == optimum
    assert len(result.trials) == 50
    assert [t.phase for t in result.trials] == ["random"] * 10 + ["tpe"] * 40
    # ... without trying every mask of the budget (56 here)
    assert result.evaluations < len(list(itertools.combinations(range(8), 3)))
    assert result.best_so_far()[-1] == result.best.loss
    # Re-proposed masks are memo hits: fewer evaluations than trials.
    assert result.evaluations <= len(result.trials)


def test_search_resumes_from_saved_trials(tmp_path):
    space = MaskSpace(8, Budget("layers", 2))
    file = tmp_path / "trials.pkl"
    seeds = [RoutingMask([2, 3])]
    first = run_search(
        AdditiveObjective(WEIGHTS), space, SearchConfig(num_random=4, num_tpe=2), file, seeds, progress=False
    )
    assert file.is_file() and len(first.trials) == 7 and first.trials[0].phase == "seed"
    # A longer run with the same file continues after the 7 saved trials; a fresh objective is
    # seeded from them, so the saved masks are not evaluated again.
    objective = AdditiveObjective(WEIGHTS)
    more = run_search(objective, space, SearchConfig(num_random=4, num_tpe=8), file, seeds, progress=False)
    assert more.resumed_from == 7 and len(more.trials) == 13
    assert [t.mask for t in more.trials[:7]] == [t.mask for t in first.trials]
    assert objective.evaluations <= 6
    # Nothing left to do: a third run evaluates nothing.
    again = run_search(
        AdditiveObjective(WEIGHTS), space, SearchConfig(num_random=4, num_tpe=8), file, seeds, progress=False
    )
    assert again.evaluations == 0 and len(again.trials) == 13


def test_search_is_reproducible():
    space = MaskSpace(8, Budget("layers", 2))
    runs = [
        run_search(AdditiveObjective(WEIGHTS), space, SearchConfig(num_random=5, num_tpe=5, seed=3), progress=False)
        for _ in range(2)
    ]
    assert [t.mask for t in runs[0].trials] == [t.mask for t in runs[1].trials]


def test_candidates_narrow_the_space_and_greedy():
    space = MaskSpace(8, Budget("layers", 2), candidates=[("layer", 2), ("layer", 3), ("layer", 5)])
    rng = np.random.default_rng(0)
    assert {i for _ in range(20) for i in space.random_mask(rng).skip_layers} <= {2, 3, 5}
    with pytest.raises(ValueError, match="outside the search's candidates"):
        space.encode(RoutingMask([1, 2]))
    with pytest.raises(ValueError, match="cannot meet"):
        MaskSpace(8, Budget("layers", 2), candidates=[("layer", 2)])
    path = greedy_removal(AdditiveObjective(WEIGHTS), 8, 2, progress=False, candidates=[1, 5, 6])
    assert [s.mask.skip_layers for s in path] == [(5,), (5, 6)]
    assert [len(s.candidates) for s in path] == [3, 2]
