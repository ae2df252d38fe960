"""framework=auto / method=auto: what this machine's latency profile chooses, lossless either way.

The profiles here are written by the test (a measured one would make the choice depend on the
machine the test runs on); what is checked is that the choice is followed and the output kept."""

from __future__ import annotations

import pytest
import torch

from tests.test_configs import compose_generate
from viasd_adapters.cli.generate import run
from viasd_adapters.costs import LatencyEntry, LatencyProfile, chosen_draft_variant, default_profile_path

NAME = "tiny-random"  # draft and target of the tiny pair share the name; the variant tells them apart
TINY = (
    "model_pair=tiny-random",
    "runtime.dtype=float32",
    "runtime.draft_dtype=float32",
    "prompt=Hello there",
    "max_new_tokens=24",
)


def write_profile(tmp_path, monkeypatch, int8_draft_ms: float) -> None:
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    costs = {"float32": {1: 100.0, 4: 104.0, 8: 108.0}, "float32+int8-weight": {1: int8_draft_ms}}
    LatencyProfile(
        entries=[
            LatencyEntry(NAME, dtype, threads, 256, n, ms) for dtype, row in costs.items() for n, ms in row.items()
        ]
    ).save(default_profile_path())


def test_a_cheap_int8_drafter_is_chosen_and_drafts(tmp_path, monkeypatch):
    write_profile(tmp_path, monkeypatch, int8_draft_ms=5.0)
    assert chosen_draft_variant(NAME, NAME, "float32", "float32") == "float32+int8-weight"
    _, ar = run(compose_generate(*TINY, "framework=ar"))
    _, auto = run(compose_generate(*TINY, "framework=auto"))
    assert auto.tokens == ar.tokens
    assert auto.stats.drafted > 0 and auto.stats.model_calls["draft"].variant == "float32+int8-weight"


def test_where_no_drafting_pays_auto_takes_greedy_steps(tmp_path, monkeypatch):
    write_profile(tmp_path, monkeypatch, int8_draft_ms=95.0)  # a draft step nearly as dear as the target's
    _, ar = run(compose_generate(*TINY, "framework=ar"))
    _, auto = run(compose_generate(*TINY, "framework=auto"))
    assert auto.tokens == ar.tokens and auto.stats.drafted == 0


def test_auto_without_a_profile_says_how_to_measure_one(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    with pytest.raises(Exception, match="viasd-profile"):
        run(compose_generate(*TINY, "framework=auto"))
