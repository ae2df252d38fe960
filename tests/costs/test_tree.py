"""Tree shapes from measured acceptance by depth and rank, and the costs of verify and draft forwards."""

from __future__ import annotations

import math
import random

import pytest

from viasd_adapters.costs.tree import most_valuable_nodes, shape_tree
from viasd_adapters.decode import RankAcceptance

WIDE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]


def test_a_round_offers_the_children_of_each_accepted_node_and_takes_the_path():
    counts = RankAcceptance()
    counts.add_round(WIDE, (0, 1))
    assert counts.offered == {(1, 0): 1, (1, 1): 1, (1, 2): 1, (2, 0): 1, (2, 1): 1}  # (0, 1) has no children
    assert counts.taken == {(1, 0): 1, (2, 1): 1}
    counts.add_round(WIDE, ())
    assert counts.offered[1, 0] == 2 and counts.offered[2, 0] == 1 and counts.rounds == 2
    assert RankAcceptance.from_dict(counts.to_dict()) == counts


def _simulate(rates: dict[int, list[float]], tree, rounds: int, seed: int = 0) -> RankAcceptance:
    """A target whose token at depth d is the drafter's rank-r guess with probability rates[d][r]."""
    rng = random.Random(seed)
    counts = RankAcceptance()
    for _ in range(rounds):
        accepted: tuple = ()
        while True:
            depth = len(accepted) + 1
            u, rank, drawn = rng.random(), None, 0.0
            for r, p in enumerate(rates.get(depth, rates[max(rates)])):
                drawn += p
                if u < drawn:
                    rank = r
                    break
            if rank is None or (*accepted, rank) not in tree:
                break
            accepted = (*accepted, rank)
        counts.add_round(tree, accepted)
    return counts


def test_rates_measured_on_a_tree_recover_the_targets_by_depth_and_rank():
    rates = {1: [0.7, 0.15, 0.05], 2: [0.6, 0.2, 0.05], 3: [0.5, 0.1, 0.1]}
    counts = _simulate(rates, WIDE, 4000)
    for (depth, rank), offered in counts.offered.items():
        if offered > 500:
            assert counts.rate(depth, rank) == pytest.approx(rates[min(depth, 3)][rank], abs=0.04)


def test_a_rarely_offered_node_borrows_the_shallower_rate():
    counts = RankAcceptance()
    for _ in range(100):
        counts.add_round([(0,), (0, 0)], (0, 0))  # depth 2 always taken
    assert (
        counts.rate(3, 0) == pytest.approx(counts.rate(2, 0)) and counts.rate(3, 0) > 0.98
    )  # never offered: depth 2's
    assert counts.rate(1, 1) == pytest.approx(counts.rate(1, 0) / 2)  # never offered: half of rank 0's


def test_the_most_valuable_nodes_form_a_tree_and_carry_the_products_of_their_rates():
    counts = _simulate({1: [0.8, 0.1], 2: [0.7, 0.2]}, WIDE, 3000)
    nodes = most_valuable_nodes(counts, 6, max_depth=4, max_rank=3)
    paths = {p for p, _ in nodes}
    for path, value in nodes:
        if len(path) > 1:
            assert path[:-1] in paths  # its parent is in
        if path[-1] > 0:
            assert (*path[:-1], path[-1] - 1) in paths  # and the better rank beside it
        expected = 1.0
        for depth, rank in enumerate(path, start=1):
            expected *= counts.rate(depth, rank)
        assert value == pytest.approx(expected)
    values = [v for _, v in nodes]
    assert values == sorted(values, reverse=True)


def test_a_dear_verify_makes_a_chain_a_flat_one_a_wider_tree():
    counts = _simulate({1: [0.75, 0.12, 0.05], 2: [0.7, 0.12, 0.05]}, WIDE, 4000)
    head = lambda rows: 3.0 + 0.2 * rows  # noqa: E731 - a cheap drafter
    dear = shape_tree(counts, verify_ms=lambda n: 100.0 + 40.0 * (n - 1), draft_ms=head)
    flat = shape_tree(counts, verify_ms=lambda n: 100.0 + 0.5 * (n - 1), draft_ms=head)
    assert all(len(c) == i + 1 and c[-1] == 0 for i, c in enumerate(dear.choices))  # a chain
    assert len(flat.choices) > len(dear.choices) and any(c[-1] > 0 for c in flat.choices)
    chain = 1 + sum(math.prod(counts.rate(d, 0) for d in range(1, k + 1)) for k in range(1, dear.depth + 1))
    assert dear.tokens_per_round == pytest.approx(chain)
    assert flat.expected_speedup > dear.expected_speedup > 1.0


def test_a_tree_cannot_be_shaped_before_any_round_was_measured():
    with pytest.raises(ValueError, match="no rounds"):
        shape_tree(RankAcceptance(), verify_ms=lambda n: 1.0, draft_ms=lambda n: 1.0)


def test_the_profiled_tree_reads_the_heads_acceptance_and_this_machines_profile(tmp_path):
    pytest.importorskip("eagle.model.cnets")
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from tests.costs.profiles import profile_of
    from tests.costs.test_cli import _head_with_recipe
    from viasd_adapters.configs import CONFIG_DIR
    from viasd_adapters.costs import draft_head_key, profiled_tree

    counts = _simulate({1: [0.8, 0.1], 2: [0.75, 0.1]}, WIDE, 2000)
    head = _head_with_recipe(tmp_path, counts.to_dict())
    threads = torch.get_num_threads()
    path = tmp_path / "profile.json"
    with pytest.raises(FileNotFoundError):
        profiled_tree("tiny-random", str(head), "float32", profile_path=str(path))
    profile_of(
        {
            ("tiny-random", "float32"): {1: 10.0, 4: 11.0, 8: 30.0},
            (draft_head_key("tiny-random", str(head)), "float32"): {1: 0.5, 8: 0.6},
        },
        threads=threads,
        context=256,
    ).save(path)
    tree = profiled_tree("tiny-random", str(head), "float32", profile_path=str(path))
    expected = shape_tree(
        counts,
        lambda n: 10.0 + (n - 1) / 3 if n <= 4 else 11.0 + (n - 4) * 19 / 4,
        lambda r: 0.5 + (r - 1) * 0.1 / 7,
        max_nodes=7,
    )
    assert tree == [list(c) for c in expected.choices] and 1 < len(tree) <= 7
    with pytest.raises(KeyError, match="run viasd-profile"):
        profiled_tree("tiny-random", str(head), "bfloat16", profile_path=str(path))
    # the method's config builds the same tree
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "bench",
            overrides=[
                "model_pair=tiny-random",
                "runtime.weights=float32",
                "method=[eagle-profiled]",
                f"method.eagle-profiled.framework.decoder.head={head}",
                f"method.eagle-profiled.framework.decoder.tree.profile_path={path}",
            ],
        )
    assert instantiate(cfg.method["eagle-profiled"].framework.decoder.tree) == tree
