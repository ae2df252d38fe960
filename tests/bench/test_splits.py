import pytest

from viasd_adapters.bench import splits

ROWS = [{"id": f"{c}{i}", "category": c} for c in "ab" for i in range(10)]


def groups(categories=None):
    return splits.by_category(ROWS, lambda row: row["category"], categories)


def ids(picked):
    return [[row["id"] for row in group] for group in picked]


def test_each_split_takes_its_own_prompts():
    assert ids(splits.evaluation(groups(), 2)) == [["a0", "a1"], ["b0", "b1"]]
    assert ids(splits.from_end(groups(), "calibration", 2)) == [["a9", "a8"], ["b9", "b8"]]
    assert ids(splits.from_end(groups(), "heldout", 2)) == [["a7", "a6"], ["b7", "b6"]]
    assert ids(splits.training(groups(), 2, 4)) == [["a2", "a3", "a4", "a5"], ["b2", "b3", "b4", "b5"]]


def test_splits_are_disjoint_when_the_budgets_fit():
    used = [
        splits.evaluation(groups(), 2),
        splits.from_end(groups(), "calibration", 2),
        splits.from_end(groups(), "heldout", 2),
        splits.training(groups(), 2, 4),
    ]
    seen = [row["id"] for picked in used for group in picked for row in group]
    assert len(seen) == len(set(seen)) == len(ROWS)


def test_round_robin_interleaves_categories():
    assert [row["id"] for row in splits.round_robin(splits.evaluation(groups(["b", "a"]), 2))] == [
        "b0",
        "a0",
        "b1",
        "a1",
    ]


def test_bad_requests_name_the_problem():
    with pytest.raises(ValueError, match=r"categories \['c'\] are not in the prompts; available: \['a', 'b'\]"):
        groups(["a", "c"])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        splits.evaluation(groups(), 0)
    with pytest.raises(ValueError, match="too few to hold out 10"):
        splits.from_end(groups(), "heldout", 5)
    with pytest.raises(ValueError, match="is not one of"):
        splits.from_end(groups(), "evaluation", 1)
