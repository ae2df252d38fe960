"""Cheaper drafting (confidence stop, reduced vocabulary, int8 drafter): each lever is lossless."""

from collections import Counter
from dataclasses import replace

import pytest
import torch

from tests.conftest import exact_marginals, perturbed, tiny
from tests.decode.test_loops import N_SAMPLED, PROMPT, sampling_pair
from tests.test_configs import compose_generate
from tests.verify.statistics import P_MIN, POWER, chi_square_p, chi_square_power, sample_counts, total_variation
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.models.quantize import Int8WeightLinear, quantized_copy
from viasd_adapters.models.vocab import DraftVocabulary, ReducedHead, count_tokens
from viasd_adapters.pipeline import ModelPair, build_decoder
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import LosslessVerifier

GREEDY = Sampler(SamplingConfig())
V = 257  # the tiny models' byte vocabulary


def first_ids(n: int) -> DraftVocabulary:
    return DraftVocabulary(list(range(n)), V)


def ar_tokens(target, n=60):
    return AutoregressiveDecoder(target).generate(PROMPT, n).tokens


# --- confidence-stopped drafting ------------------------------------------------------------


def test_confidence_threshold_ends_the_block_after_an_unsure_token(tiny_draft):
    full = ModelDrafter(tiny_draft).propose(PROMPT, 6, GREEDY)
    p_x = full.probs[torch.arange(6), full.tokens]  # [6] the draft's probability of each token
    threshold = float(p_x[2]) + 1e-6  # token 2 is the first below it when tokens 0, 1 are surer
    if not (p_x[:2] >= threshold).all():
        threshold = float(p_x[0]) + 1e-6
    stop = int((p_x < threshold).nonzero()[0]) + 1
    block = ModelDrafter(tiny_draft, confidence_threshold=threshold).propose(PROMPT, 6, GREEDY)
    assert len(block) == stop < 6
    assert block.tokens.tolist() == full.tokens[:stop].tolist()
    assert len(ModelDrafter(tiny_draft, confidence_threshold=1.0).propose(PROMPT, 6, GREEDY)) == 1
    assert len(ModelDrafter(tiny_draft, confidence_threshold=0.0).propose(PROMPT, 6, GREEDY)) == 6


@pytest.mark.parametrize("threshold", [0.3, 0.6, 0.9])
def test_confidence_stopped_sd_equals_ar_fp32(tiny_target, tiny_draft, threshold):
    drafter = ModelDrafter(tiny_draft, confidence_threshold=threshold)
    out = SpeculativeDecoder(drafter, LosslessVerifier(tiny_target.model), 6).generate(PROMPT, 60)
    assert out.tokens == ar_tokens(tiny_target.model)
    assert out.stats.accepted > 0 and out.stats.drafted < 6 * out.stats.steps  # it did stop early


def test_bad_confidence_threshold_raises(tiny_draft):
    with pytest.raises(ValueError, match="confidence_threshold"):
        ModelDrafter(tiny_draft, confidence_threshold=1.5)


# --- reduced-vocabulary draft head -----------------------------------------------------------


def test_reduced_head_scores_the_kept_rows_of_the_full_head(tiny_draft):
    vocab = DraftVocabulary([5, 200, 3, 77], V)
    head = ReducedHead(tiny_draft, vocab)
    hidden = torch.randn(3, tiny_draft.config.hidden_size)
    full = tiny_draft.get_output_embeddings()(hidden)  # [3, V]
    torch.testing.assert_close(head(hidden), full[:, [5, 200, 3, 77]])
    assert tiny_draft.get_output_embeddings().weight.shape[0] == V  # the model is untouched


def test_reduced_vocabulary_drafts_the_best_kept_id(tiny_draft):
    kept = list(range(0, V, 2))  # even ids only
    block = ModelDrafter(tiny_draft, vocabulary=DraftVocabulary(kept, V)).propose(PROMPT, 5, GREEDY)
    logits = tiny_draft(torch.cat([PROMPT, block.tokens[None, :1]], 1)).logits[0, -2]  # [V]
    assert int(block.tokens[0]) == kept[int(logits[kept].argmax())]
    assert all(t % 2 == 0 for t in block.tokens.tolist())
    assert block.probs.shape == (5, V)
    torch.testing.assert_close(block.probs.sum(-1), torch.ones(5))
    assert block.probs[:, 1::2].abs().max() == 0  # zero outside the kept ids


@pytest.mark.parametrize("size", [257, 120, 40])
def test_reduced_vocabulary_sd_equals_ar_fp32(tiny_target, tiny_draft, size):
    ar = ar_tokens(tiny_target.model)
    # Keep the ids the target's own output uses least: the check has teeth at size 40.
    counts = count_tokens([ar])
    vocab = DraftVocabulary.from_counts(counts, size, V)
    drafter = ModelDrafter(tiny_draft, vocabulary=vocab)
    out = SpeculativeDecoder(drafter, LosslessVerifier(tiny_target.model), 4).generate(PROMPT, 60)
    assert out.tokens == ar
    assert out.stats.accepted > 0
    if size == 40:
        assert not set(ar) <= set(vocab.token_ids)  # some target tokens cannot be drafted


def test_reduced_vocabulary_sampling_reproduces_the_target_distribution():
    """Statistical: with a proposal that is zero on most ids, SD still samples from q."""
    target, draft = sampling_pair()
    q = exact_marginals(target, PROMPT, 2)  # [2, V] the 1st and 2nd token's marginals
    # Keep the 20 ids the draft likes most for the first token, minus the target's favourite 2nd:
    # q's most likely 2nd token can then only come from the residual.
    p1 = exact_marginals(draft, PROMPT, 1)[0]
    kept = [i for i in p1.argsort(descending=True).tolist() if i != int(q[1].argmax())][:20]
    decoder = SpeculativeDecoder(ModelDrafter(draft, vocabulary=DraftVocabulary(kept, V)), LosslessVerifier(target), 3)
    counts, results = sample_counts(decoder, PROMPT, V, 2, N_SAMPLED)
    assert sum(r.stats.accepted for r in results) > N_SAMPLED // 20  # kept ids were accepted too
    for i in range(2):
        inside = torch.zeros(V)
        inside[kept] = q[i, kept]
        # power against a sampler that lost the ids the draft cannot propose
        assert chi_square_power(q[i], inside / inside.sum(), N_SAMPLED) > POWER
        assert chi_square_p(counts[i], q[i]) > P_MIN, (i, total_variation(counts[i], q[i]))


@pytest.mark.parametrize("framework", ["sd-fast", pytest.param("sd-adaptive-int8", marks=pytest.mark.slow)])
def test_combined_configurations_sample_the_target_distribution(framework):
    """Statistical: the shipped configuration, composed as the CLI does, on the peaked tiny pair:
    the first two sampled tokens follow the target's exact marginals."""
    target, draft = sampling_pair()
    loaded = tiny(seed=0, num_layers=2, init_std=0.5)
    pair = ModelPair(replace(loaded, model=target), replace(loaded, model=draft))
    cfg = compose_generate(
        "model_pair=tiny-random", "runtime.weights=float32", "runtime.draft_weights=float32", f"framework={framework}"
    )
    decoder = build_decoder(cfg.framework, cfg.verifier, pair)
    q, p = exact_marginals(target, PROMPT, 2), exact_marginals(draft, PROMPT, 2)  # [2, V] each
    counts, results = sample_counts(decoder, PROMPT, V, 2, N_SAMPLED)
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert N_SAMPLED // 4 < accepted < drafted - N_SAMPLED // 4  # drafts were kept and rejected
    for i in range(2):
        assert chi_square_power(q[i], p[i], N_SAMPLED) > POWER  # it tells the target from the draft
        assert chi_square_p(counts[i], q[i]) > P_MIN, (i, total_variation(counts[i], q[i]))


def test_vocabulary_from_counts_ranks_by_count_then_id_and_pins_stop_tokens():
    vocab = DraftVocabulary.from_counts(Counter({9: 5, 4: 5, 7: 9}), 5, 10, always=[256 % 10])
    assert vocab.token_ids == [6, 7, 4, 9, 0]  # pinned, then by count (ties by id), then by id
    assert vocab.description["calibration_coverage"] == 1.0


def test_vocabulary_round_trips_and_rejects_bad_input(tmp_path, tiny_draft):
    path = first_ids(10).save(tmp_path / "v.json")
    assert DraftVocabulary.load(path).token_ids == list(range(10))
    with pytest.raises(ValueError, match="neither a file nor a shipped name"):
        DraftVocabulary.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="distinct"):
        DraftVocabulary([1, 1], V)
    with pytest.raises(ValueError, match="outside"):
        DraftVocabulary([300], V)
    with pytest.raises(ValueError, match="rebuild it"):
        ReducedHead(tiny_draft, DraftVocabulary([1, 2], 1000))


# --- int8 drafter -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["int8-weight", "int8-dynamic"])
def test_int8_drafter_is_close_to_its_model_and_shares_the_rest(tiny_target, kind):
    # the 0.02-perturbed tiny target: its argmax margins are wide enough for an int8 copy to keep
    # 10 of 12 (the tiny pair's draft keeps 8-9: near-ties of a random model, not int8 error)
    tiny_draft = perturbed(tiny_target.model, 0.02)
    before = {n: p.clone() for n, p in tiny_draft.state_dict().items()}
    q = quantized_copy(tiny_draft, kind)
    assert q.get_input_embeddings().weight is tiny_draft.get_input_embeddings().weight  # shared, not copied
    assert not any(isinstance(m, torch.nn.Linear) for m in q.modules())
    for n, p in tiny_draft.state_dict().items():  # the original is untouched
        assert torch.equal(p, before[n]), n
    for m in q.modules():  # the int8 kernel on the whole prompt, not only on decode-sized inputs
        if isinstance(m, Int8WeightLinear):
            m.max_rows = PROMPT.numel()
    with torch.no_grad():
        a, b = q(PROMPT).logits[0], tiny_draft(PROMPT).logits[0]  # [T, V]
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8
    assert not torch.equal(a, b)


def test_int8_weight_linear_goes_dense_above_its_row_limit():
    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    q = Int8WeightLinear(linear, max_rows=4)
    assert q.dense_weight is linear.weight  # shared, not copied
    few, many = torch.randn(1, 4, 64, dtype=torch.bfloat16), torch.randn(1, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(q(many), linear(many))  # a prompt: the dense kernel
        int8, dense = q(few), linear(few)  # a decode step: the int8 kernel, close to dense
    assert not torch.equal(int8, dense) and torch.allclose(int8, dense, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("kind", ["int8-weight", "int8-dynamic"])
def test_int8_drafter_sd_equals_ar_fp32(tiny_target, tiny_draft, kind):
    drafter = ModelDrafter(tiny_draft, quantize=kind)
    out = SpeculativeDecoder(drafter, LosslessVerifier(tiny_target.model), 4).generate(PROMPT, 60)
    assert out.tokens == ar_tokens(tiny_target.model)
    assert out.stats.accepted > 0


def test_all_levers_together_equal_ar_fp32(tiny_target, tiny_draft):
    # a low threshold: blocks long enough that some end partway (a prefix accepted, then a rejection)
    drafter = ModelDrafter(tiny_draft, confidence_threshold=0.1, vocabulary=first_ids(200), quantize="int8-weight")
    out = SpeculativeDecoder(drafter, LosslessVerifier(tiny_target.model), 6).generate(PROMPT, 60)
    assert out.tokens == ar_tokens(tiny_target.model)
    assert 0 < out.stats.accepted < out.stats.drafted  # both accept and reject paths ran


def test_unknown_quantization_raises(tiny_draft):
    with pytest.raises(ValueError, match="int8-weight"):
        ModelDrafter(tiny_draft, quantize="int2")


def test_a_vocabulary_built_on_sharegpt_counts_its_answers_not_its_questions(tmp_path, monkeypatch):
    import json

    from hydra import compose, initialize_config_dir

    from viasd_adapters.cli.build_vocab import run
    from viasd_adapters.configs import CONFIG_DIR
    from viasd_adapters.models.tiny import byte_tokenizer
    from viasd_adapters.train import corpus

    turns = [{"from": "human", "value": "zzzzzzzzzzzz"}, {"from": "gpt", "value": "ab ab ab"}]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([{"id": "c0", "conversations": turns}, {"id": "c1", "conversations": turns}]))
    monkeypatch.setattr(corpus, "sharegpt_path", lambda: data)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "build_vocab",
            overrides=[
                "model_pair=tiny-random",
                "sources=[]",
                "sharegpt_conversations=2",
                "size=4",
                f"out_dir={tmp_path}",
                "progress=false",
            ],
        )
    vocab, path = run(cfg)
    tokenizer = byte_tokenizer()
    answer, question = (set(tokenizer(t["value"], add_special_tokens=False).input_ids) for t in reversed(turns))
    assert answer <= set(vocab.token_ids) and not question & set(vocab.token_ids)
    assert DraftVocabulary.load(path).description["sharegpt_conversations"] == 2
