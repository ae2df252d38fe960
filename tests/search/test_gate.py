"""The block gate: its feature, its threshold choice by hand, and calibration on VIA-SD's blocks."""

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import perturbed, tiny
from viasd_adapters.pipeline import ModelPair
from viasd_adapters.search.gate_calibration import calibrate_gate, observe_blocks
from viasd_adapters.verify.gate import DraftConfidenceGate, block_confidence, choose_gate


def test_block_confidence_is_the_least_confident_draft_token():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.6, 0.1]])
    assert block_confidence(torch.tensor([0, 2, 1]), p) == pytest.approx(0.6)
    assert block_confidence(torch.tensor([0, 2, 0]), p) == pytest.approx(0.3)
    assert DraftConfidenceGate(0.5).use_slim(torch.tensor([0, 2, 1]), p)
    assert not DraftConfidenceGate(0.5).use_slim(torch.tensor([0, 2, 0]), p)
    with pytest.raises(ValueError):
        DraftConfidenceGate(1.5)


def test_choose_gate_by_hand():
    # slim pass 0.8 of a full forward, escalation 0.6 more; gated blocks cost 1
    choice = choose_gate([0.9, 0.8, 0.3, 0.2], [True, True, False, False], slim_ratio=0.8, escalate_ratio=0.6)
    # no gate: (0.8 + 0.8 + 1.4 + 1.4) / 4 = 1.1; gate between 0.3 and 0.8: (0.8 + 0.8 + 1 + 1) / 4 = 0.9
    assert choice.min_confidence == pytest.approx(0.55) and choice.cost_gated == pytest.approx(0.9)
    assert choice.cost_ungated == pytest.approx(1.1)
    assert choice.gated_share == 0.5 and choice.lost_settled == 0.0 and choice.settled_share == 0.5


def test_choose_gate_keeps_the_slim_pass_when_it_always_pays():
    choice = choose_gate([0.1, 0.2], [True, True], slim_ratio=0.5, escalate_ratio=0.7)
    assert choice.min_confidence == 0.0 and choice.gated_share == 0.0
    with pytest.raises(ValueError):
        choose_gate([], [], 0.5, 0.5)


@pytest.fixture(scope="module")
def pair():
    target = tiny(seed=3, num_layers=4)
    draft = tiny(seed=3, num_layers=4)
    draft.model = perturbed(target.model, 0.05)
    return ModelPair(target, draft)


FRAMEWORK = OmegaConf.create(
    {
        "name": "sd",
        "drafter": {"_target_": "viasd_adapters.draft.ModelDrafter", "model": "pair.draft"},
        "decoder": {"_target_": "viasd_adapters.decode.SpeculativeDecoder", "num_draft_tokens": 4},
    }
)


def _verifier(tau):
    return OmegaConf.create(
        {
            "_target_": "viasd_adapters.verify.TieredVerifier",
            "slim": {
                "_target_": "viasd_adapters.routing.SlimModel",
                "_partial_": True,
                "mask": {"_target_": "viasd_adapters.routing.RoutingMask", "skip_layers": [2], "num_layers": 4},
            },
            "policy": {"_target_": "viasd_adapters.verify.ConfidencePolicy", "tau_accept": tau, "tau_slim": tau},
            "max_unverified": 8,
        }
    )


def test_observations_follow_the_tiers(pair):
    prompts = [torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[9, 8, 7]])]
    always = observe_blocks(pair, FRAMEWORK, _verifier(0.0), prompts, 12)  # tier 1 takes every token it may
    never = observe_blocks(pair, FRAMEWORK, _verifier(1.0), prompts, 12)  # thresholds of 1: all escalate
    assert never and not any(settled for _, settled in never)
    assert always and any(settled for _, settled in always)
    # the drift cap (8 unverified tokens) forces an escalation within every three 4-token blocks
    assert not all(settled for _, settled in always)
    assert all(0.0 <= c <= 1.0 for c, _ in always + never)
    choice = calibrate_gate(pair, FRAMEWORK, _verifier(1.0), prompts, 12, slim_ratio=0.75, escalate_ratio=1.0)
    assert choice.gated_share == 1.0  # nothing ever settles: the gate sends every block to the full model
    assert choice.cost_gated == pytest.approx(1.0) and choice.cost_ungated == pytest.approx(1.75)


def _generate(pair, verifier_node, prompt, n=16):
    from viasd_adapters.pipeline import build_decoder
    from viasd_adapters.sampling import SamplingConfig

    decoder = build_decoder(FRAMEWORK, verifier_node, pair)
    return decoder.generate(prompt, n, SamplingConfig(), ())


def test_a_closed_gate_skips_every_slim_pass_and_is_lossless_sd(pair):
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    closed = OmegaConf.merge(
        _verifier(0.0), {"gate": {"_target_": "viasd_adapters.verify.gate.DraftConfidenceGate", "min_confidence": 1.0}}
    )
    gated = _generate(pair, closed, prompt)
    lossless = _generate(pair, OmegaConf.create({"_target_": "viasd_adapters.verify.LosslessVerifier"}), prompt)
    assert gated.stats.model_calls["slim"].calls == 0
    assert gated.tokens == lossless.tokens  # every block went to the full model
    opened = OmegaConf.merge(closed, {"gate": {"min_confidence": 0.0}})
    assert _generate(pair, opened, prompt).stats.model_calls["slim"].calls > 0


def test_eagle_refuses_a_gate_instead_of_ignoring_it(pair):
    from hydra.utils import instantiate

    from viasd_adapters.hosts.eagle import EagleDecoder

    node = OmegaConf.merge(_verifier(0.5), {"gate": {"_target_": "viasd_adapters.verify.gate.DraftConfidenceGate"}})
    verifier = instantiate(node, target=pair.target.model)
    with pytest.raises(ValueError, match="does not honour the verifier's gate"):  # before any head loads
        EagleDecoder(target=pair.target.model, head="no-head-needed", verifier=verifier)
