"""Decoding parts built from the profile: the adaptive draft length of a fixed pair, with or without a profile."""

import pytest

from viasd_adapters.costs import adaptive_draft_length
from viasd_adapters.decode.schedule import DraftCosts


def test_without_a_profile_the_schedule_uses_its_stated_fallback_or_fails(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))  # no profile cached here
    names = dict(draft="d", target="t", precision="bfloat16", draft_precision="bfloat16")
    with pytest.raises(FileNotFoundError, match="viasd-profile"):
        adaptive_draft_length(**names)
    with caplog.at_level("WARNING"):
        schedule = adaptive_draft_length(**names, fallback_costs={"draft_step": 0.5, "verify": [1.0, 3.0]})
    assert "viasd-profile" in caplog.text
    assert schedule.costs == DraftCosts(0.5, (1.0, 3.0))
    assert schedule.next() == 1  # a verify that costs 2 steps per token: never draft long
    with pytest.raises(FileNotFoundError):  # a profile named explicitly must exist
        adaptive_draft_length(
            **names, profile_path=str(tmp_path / "missing.json"), fallback_costs={"draft_step": 0.5, "verify": [1.0]}
        )
