"""Prompt splits: which prompts of a file each command may use, so that none tunes on what the
benchmark measures. Every command that picks prompts by category goes through this module.

Per category, in file order:
  evaluation   the first `limit` prompts                       viasd-bench (`task.limit`)
  calibration  the last `per_category` prompts                 viasd-search, viasd-calibrate,
                                                               build_vocab, gate calibration
  heldout      the `per_category` prompts before those         viasd-eval-mask
  training     between the first `first_excluded` and the      viasd-train-eagle
               last `last_excluded` prompts
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

Row = TypeVar("Row")

FROM_END = ("calibration", "heldout")  # the splits counted from the end of each category, in order


def by_category(rows: Iterable[Row], category: Callable[[Row], str], categories: list[str] | None) -> list[list[Row]]:
    """The rows of each category, in file order, for the listed categories (all, in first-seen
    order, when None); an unknown category is an error that lists the available ones."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[category(row)].append(row)
    order = list(groups) if categories is None else list(categories)
    unknown = [c for c in order if c not in groups]
    if unknown:
        raise ValueError(f"categories {unknown} are not in the prompts; available: {sorted(groups)}")
    return [groups[c] for c in order]


def evaluation(groups: list[list[Row]], limit: int | None) -> list[list[Row]]:
    """The first `limit` rows of each category (None keeps all)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 prompts per category (or null for all), got {limit}")
    return [group[:limit] for group in groups]


def from_end(
    groups: list[list[Row]], split: str, per_category: int, name: Callable[[int], str] = str
) -> list[list[Row]]:
    """The `per_category` rows of `split` ("calibration" or "heldout"), counted from the end,
    last first; `name(i)` names category i in errors."""
    if split not in FROM_END:
        raise ValueError(f"split {split!r} is not one of {FROM_END}")
    skip = FROM_END.index(split) * per_category
    picked = []
    for i, group in enumerate(groups):
        if len(group) < skip + per_category + 1:
            raise ValueError(
                f"category {name(i)!r} has {len(group)} prompts: too few to hold out {skip + per_category}"
            )
        picked.append(list(reversed(group[len(group) - skip - per_category : len(group) - skip])))
    return picked


def training(groups: list[list[Row]], first_excluded: int, last_excluded: int) -> list[list[Row]]:
    """The rows between the evaluation split (the first `first_excluded`) and the calibration and
    held-out splits (the last `last_excluded`) of each category."""
    return [group[first_excluded : len(group) - last_excluded] for group in groups]


def check_disjoint(
    first: Iterable[Row], second: Iterable[Row], text: Callable[[Row], str], first_name: str, second_name: str
) -> None:
    """ValueError naming the shared rows unless no row of `first` has the text (whitespace and
    case aside) of a row of `second`: a choice made on one split is confirmed on the other only then."""

    def key(row: Row) -> str:
        return " ".join(text(row).split()).casefold()

    seen = {key(row) for row in second}
    shared = [text(row) for row in first if key(row) in seen]
    if shared:
        preview = "; ".join(repr(t[:60]) for t in shared[:3])
        raise ValueError(
            f"{len(shared)} prompt(s) of {first_name} are also in {second_name} ({preview}...): the splits must be"
            f" disjoint; take {first_name}'s prompts from another file or other categories"
        )


def round_robin(groups: list[list[Row]]) -> list[Row]:
    """One row of each category in turn, until every category is used up."""
    return [g[i] for i in range(max((len(g) for g in groups), default=0)) for g in groups if i < len(g)]
