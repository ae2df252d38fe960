"""The one timing loop: models take turns, caches crop back to the context, the device is synchronised."""

import torch

from tests.conftest import tiny
from viasd_adapters.costs import measure_cost_ratio, time_forwards, timing
from viasd_adapters.routing import RoutingMask
from viasd_adapters.runner import CausalLMRunner


def record_forwards(monkeypatch) -> list[tuple[str, int, int]]:
    """Every runner forward from now on, as (model, tokens scored, tokens cached after it)."""
    fed = []
    logits = CausalLMRunner.logits

    def spy(self, ids, n):
        out = logits(self, ids, n)
        fed.append((self.name, n, self.cached_length))
        return out

    monkeypatch.setattr(CausalLMRunner, "logits", spy)
    return fed


def test_time_forwards_takes_turns_and_crops_back_to_the_context(monkeypatch):
    fed = record_forwards(monkeypatch)
    times = time_forwards({"a": tiny(seed=0).model, "b": tiny(seed=1).model}, context=16, new_tokens=[1, 4], repeats=2)
    assert set(times) == {"a", "b"} and all(len(v) == 2 and min(v) > 0 for row in times.values() for v in row.values())
    assert fed[:2] == [("a", 1, 16), ("b", 1, 16)]  # each model prefills the context once
    timed = fed[2:]
    assert all(cached == 16 + n for _, n, cached in timed)  # cropped back to the context, n tokens fed
    # repetition 0 (warm-up) runs a before b, repetition 1 b before a: drift hits both alike
    assert [name for name, *_ in timed[:4]] == ["a", "b", "a", "b"]
    assert [name for name, *_ in timed[4:8]] == ["b", "a", "b", "a"]
    assert len(timed) == 3 * 2 * 2  # (1 warm-up + 2) repetitions x 2 counts x 2 models


def test_every_timed_forward_is_fenced_by_device_syncs(monkeypatch):
    # On an accelerator the clock must read finished work: a sync before and after each forward.
    events = []
    monkeypatch.setattr(timing, "synchronize", lambda device: events.append("sync"))
    logits = CausalLMRunner.logits
    monkeypatch.setattr(CausalLMRunner, "logits", lambda self, ids, n: events.append("forward") or logits(self, ids, n))
    time_forwards({"a": tiny(seed=0).model}, context=8, new_tokens=[2], repeats=2)
    assert events[0] == "forward"  # the context's prefill is not timed
    assert events[1:] == ["sync", "forward", "sync"] * 3  # 1 warm-up + 2 timed repetitions


def test_the_slim_full_cost_ratio_times_both_in_turn_on_the_given_context(monkeypatch):
    fed = record_forwards(monkeypatch)
    context = torch.arange(10, 22)[None]  # [1, 12]
    ratio = measure_cost_ratio(
        tiny(seed=0).model, RoutingMask([1, 2], num_layers=4), context, 3, repetitions=3, warmup=2
    )
    assert (ratio.new_tokens, ratio.context, ratio.repetitions) == (3, 12, 3)
    assert ratio.full_ms > 0 and ratio.slim_ms > 0 and ratio.ratio > 0
    assert fed[:2] == [("full", 1, 12), ("slim", 1, 12)]  # each prefills the given context once
    timed = fed[2:]
    assert [name for name, *_ in timed] == ["full", "slim", "slim", "full"] * 2 + ["full", "slim"]  # 2 warm-up + 3
    assert all((n, cached) == (3, 15) for _, n, cached in timed)  # cropped back to the context each time
