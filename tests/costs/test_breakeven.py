"""What a slim tier must cost or settle for VIA-SD to beat its host by a given factor, by hand."""

import pytest

from viasd_adapters.costs import settled_share_needed, slim_ratio_needed


def test_settled_share_needed_by_hand():
    # GPU-like: c = 0.05, K = 5: SD costs 1.25 per round; VIA-SD with s = 0.6, e = 0.8 must keep
    # s + (1 - x) e <= 1.25 / 1.1 - 0.25 = 0.8864 -> x >= 1 - 0.2864 / 0.8 = 0.642
    assert settled_share_needed(0.05, 5, 0.6, 0.8) == pytest.approx(1 - (1.25 / 1.1 - 0.25 - 0.6) / 0.8)
    # this CPU: c = 0.47: the slim pass alone (0.83) is more than SD's whole margin
    assert settled_share_needed(0.47, 5, 0.83, 0.6) is None
    # a free slim pass that settles nothing, against no gain: nothing needed
    assert settled_share_needed(0.1, 4, 0.0, 1.0, gain=1.0) == pytest.approx(0.0, abs=1e-12)


def test_slim_ratio_needed_by_hand():
    # c = 0.25, K = 2: the host pays 1.5 per round; settling 36 % with e = 0.6 leaves
    # s <= 1.5 / 1.1 - 0.5 - 0.64 * 0.6 = 0.4796
    assert slim_ratio_needed(0.25, 2, 0.36, 0.6) == pytest.approx(1.5 / 1.1 - 0.5 - 0.64 * 0.6)
    # the two are inverses of one another
    s = slim_ratio_needed(0.1, 3, 0.5, 0.7)
    assert settled_share_needed(0.1, 3, s, 0.7) == pytest.approx(0.5)
    # settling nothing with a full escalation: even a free slim pass loses the 10 %
    assert slim_ratio_needed(0.25, 2, 0.0, 1.0) is None
