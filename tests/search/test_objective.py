import pytest
import torch

from tests.conftest import tiny
from viasd_adapters.routing import RoutingMask, SlimModel
from viasd_adapters.search import CalibrationSet, CalibrationText, EvaluationStore, MaskObjective, Reference
from viasd_adapters.search.objective import compare


def calibration() -> CalibrationSet:
    g = torch.Generator().manual_seed(0)
    texts = [
        CalibrationText(f"t{i}", torch.randint(0, 256, (n,), generator=g).tolist(), m)
        for i, (n, m) in enumerate([(40, 16), (25, 10), (33, 20)])
    ]
    return CalibrationSet(texts, key="test")


@pytest.fixture(scope="module")
def reference():
    return Reference(tiny(seed=5, num_layers=6).model, calibration(), progress=False)


def test_identity_mask_is_perfect(reference):
    m = MaskObjective(reference)(RoutingMask.none())
    assert m.top1 == 1.0 and abs(m.kl) < 1e-6 and m.num_positions == 46


def test_objective_is_deterministic(reference):
    masks = [RoutingMask([2]), RoutingMask([0, 4]), RoutingMask(skip_attention=[1], skip_mlp=[3])]
    first = [MaskObjective(reference).evaluate(m) for m in masks]
    again = [MaskObjective(reference).evaluate(m) for m in masks]
    rebuilt = Reference(reference.target, calibration(), progress=False)
    third = [MaskObjective(rebuilt).evaluate(m) for m in masks]
    assert first == again == third  # seconds are excluded from equality
    assert len({m.kl for m in first}) == 3


def test_prefix_reuse_matches_a_plain_slim_forward(reference):
    """The objective starts at the first skipped layer from cached hidden states; same result."""
    mask = RoutingMask([3, 4])
    slim = SlimModel(reference.target, mask)
    kls, agrees = [], []
    with torch.no_grad():
        for text, ref in zip(reference.calibration.texts, reference.texts):
            ids = torch.tensor(text.ids)[None, :-1]
            log_u = torch.log_softmax(slim(ids, logits_to_keep=text.num_scored).logits[0].float(), -1)
            log_q = torch.log_softmax(reference.target(ids, logits_to_keep=text.num_scored).logits[0].float(), -1)
            torch.testing.assert_close(log_q, ref.log_q, rtol=1e-5, atol=1e-5)
            kl, agree = compare(log_q, log_u)
            kls.append(kl)
            agrees.append(agree)
    m = MaskObjective(reference)(mask)
    assert m.kl == pytest.approx(float(torch.cat(kls).mean()), rel=1e-4)
    assert m.top1 == pytest.approx(float(torch.cat(agrees).float().mean()))


def test_memo_and_store(reference, tmp_path):
    store = EvaluationStore(tmp_path / "evals.jsonl")
    objective = store.attach(MaskObjective(reference))
    a = objective(RoutingMask([1]))
    objective(RoutingMask([1], num_layers=6, model="other name"))  # same skips: a memo hit
    assert objective.evaluations == 1
    fresh = store.attach(MaskObjective(reference))
    assert fresh(RoutingMask([1])) == a and fresh.evaluations == 0
    with pytest.raises(ValueError, match="out of range"):
        fresh(RoutingMask([6]))
