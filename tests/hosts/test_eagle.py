"""EAGLE adapter: identity with stock eagle-llm, tiered tree verification, Qwen2 integration, head training."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException

from tests.conftest import exact_marginals, import_or_skip_outside_ci, tiny
from tests.verify.statistics import P_MIN, chi_square_p

eagle_utils = import_or_skip_outside_ci("eagle.model.utils")

from eagle.model.choices import mc_sim_7b_63  # noqa: E402
from eagle.model.ea_model import EaModel  # noqa: E402

from viasd_adapters.configs import CONFIG_DIR  # noqa: E402
from viasd_adapters.decode import AutoregressiveDecoder  # noqa: E402
from viasd_adapters.hosts.eagle import (  # noqa: E402
    SHIPPED_HEADS,
    EagleDecoder,
    TieredEagle,
    _parents,
    draft_tree,
)
from viasd_adapters.models.vocab import DraftVocabulary, VocabularyDraftHead  # noqa: E402
from viasd_adapters.routing import RoutingMask  # noqa: E402
from viasd_adapters.sampling import Sampler, SamplingConfig  # noqa: E402
from viasd_adapters.third_party.eagle import (  # noqa: E402
    FULL_WEIGHTS,
    KVBuffers,
    TransformersEagleBase,
    build_head,
    ea_model_from_target,
    export_head,
    head_config,
    load_ea_model,
    save_head,
)
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, Tier  # noqa: E402
from viasd_adapters.verify.decision import SlimScores  # noqa: E402
from viasd_adapters.verify.tree import DraftTree, decide_tree  # noqa: E402

PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])


@pytest.fixture(autouse=True, scope="module")
def _quiet_and_single_threaded():
    level, threads = transformers.logging.get_verbosity(), torch.get_num_threads()
    transformers.logging.set_verbosity_error()  # eagle-llm's Llama class triggers GenerationMixin warnings
    torch.set_num_threads(1)  # tiny models: threads only add overhead (and stall on a busy host)
    yield
    transformers.logging.set_verbosity(level)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_pair(request, tmp_path_factory):
    """(target folder, compact head folder) of a tiny random target of each architecture."""
    arch = request.param
    root = tmp_path_factory.mktemp(f"eagle-{arch}")
    loaded = tiny(seed=0, architecture=arch)
    loaded.model.save_pretrained(root / "target")
    loaded.tokenizer.save_pretrained(root / "target")
    config = head_config(loaded.model.config, intermediate_size=96)
    torch.manual_seed(0)
    save_head(build_head(config), config, root / "head", full=False, compact=True)
    return arch, root / "target", root / "head"


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def accepting_pair(request, tmp_path_factory):
    """(target folder, compact head folder) of a pair whose head's drafts the target often accepts.

    The random heads of `tiny_pair` put none of the target's greedy tokens in their trees (257
    tokens, top-10 at each node), so they never reach the accept path. Here the target has one
    decoder layer and the head is a copy of it: its fc passes the token embedding through (the
    feature half is zeroed), its layer is the target's. The target's embedding rows are scaled to
    RMS 1, so the input norm the head's first layer lacks is the identity, and its biases are zero
    (the head's attention has none). The head still misses the prompt's first token (pair i is
    feature i with token i + 1) and reads its own outputs deeper in the tree, so it is right on
    most, not all, drafts: 0 < accepted < drafted, which the identity tests assert.
    """
    arch = request.param
    root = tmp_path_factory.mktemp(f"eagle-accepting-{arch}")
    loaded = tiny(seed=0, num_layers=1, architecture=arch, init_std=0.8)  # peaked: the tiers settle tokens at tau 0.3
    model = loaded.model
    with torch.no_grad():
        embeddings = model.model.embed_tokens.weight
        embeddings.div_(embeddings.pow(2).mean(-1, keepdim=True).sqrt())
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.zero_()
    model.save_pretrained(root / "target")
    loaded.tokenizer.save_pretrained(root / "target")
    config = head_config(model.config)
    head = build_head(config)
    with torch.no_grad():
        H = model.config.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, :H] = torch.eye(H)  # fc(cat(embedding, feature)) = embedding
        head.fc.bias.zero_()
        layer = {
            k: v
            for k, v in model.model.layers[0].state_dict().items()
            if not k.startswith("input_layernorm") and not k.endswith(".bias")
        }
        head.layers[0].load_state_dict(layer, strict=True)
    save_head(head, config, root / "head", full=False, compact=True)
    return arch, root / "target", root / "head"


def _acceptance(decoder: EagleDecoder, max_new_tokens: int = 40) -> tuple[int, int]:
    """(accepted, drafted) of a greedy generation after PROMPT."""
    stats = decoder.generate(PROMPT, max_new_tokens).stats
    return stats.accepted, stats.drafted


_LOADED: dict = {}


def _stock(tiny_pair, backend="transformers") -> EaModel:
    """The EaModel of a tiny pair (loaded once per module; every generation resets its state)."""
    arch, target, head = tiny_pair
    if (target, backend) not in _LOADED:
        _LOADED[target, backend] = load_ea_model(target, head, backend=backend)
    return _LOADED[target, backend]


def _target(tiny_pair):
    """The tiny pair's target as transformers loads it (shared with its transformers-backend EaModel)."""
    return _stock(tiny_pair).base_model.target


# ----------------------------------------------------------------------------- identity with stock
@pytest.mark.parametrize("backend", ["transformers", "eagle"])
def test_slim_off_is_token_identical_to_stock_eagenerate(accepting_pair, backend):
    if backend == "eagle" and accepting_pair[0] != "llama":
        pytest.skip("eagle-llm's own loader handles Llama only")
    ea = _stock(accepting_pair, backend)
    stock = ea.eagenerate(PROMPT, max_new_tokens=40)
    ours = TieredEagle(ea).eagenerate(PROMPT, max_new_tokens=40)
    assert torch.equal(stock, ours)
    accepted, drafted = _acceptance(EagleDecoder(ea_model=ea))
    assert 0 < accepted < drafted  # the accept path ran, and so did the rejections


def test_slim_off_sampling_is_token_identical_to_stock_under_the_same_seeds(accepting_pair):
    ea = _stock(accepting_pair)
    torch.manual_seed(7), random.seed(7)
    stock = ea.eagenerate(PROMPT, temperature=0.8, top_p=0.9, max_new_tokens=30)
    torch.manual_seed(7), random.seed(7)
    ours = TieredEagle(ea).eagenerate(PROMPT, temperature=0.8, top_p=0.9, max_new_tokens=30)
    assert torch.equal(stock, ours)
    stats = EagleDecoder(ea_model=ea).generate(PROMPT, 30, SamplingConfig(temperature=0.8, top_p=0.9, seed=7)).stats
    assert 0 < stats.accepted < stats.drafted  # EAGLE's tree rejection sampling kept some drafts, not all


def test_stock_eagle_llama_matches_transformers_backend_on_rope_10000(tiny_pair):
    if tiny_pair[0] != "llama":
        pytest.skip("Llama only")
    # The tiny Llama uses rope_theta 10000, the base eagle-llm hard-codes: both backends agree.
    a = _stock(tiny_pair, "eagle").eagenerate(PROMPT, max_new_tokens=30)
    b = _stock(tiny_pair, "transformers").eagenerate(PROMPT, max_new_tokens=30)
    assert torch.equal(a, b)


def test_eagle_tree_decoding_is_lossless_against_autoregressive(accepting_pair):
    _, target, head = accepting_pair
    model = _target(accepting_pair)
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    eagle = EagleDecoder(target=model, head=head).generate(PROMPT, 40)
    assert eagle.tokens == ar.tokens
    stats = eagle.stats
    assert 0 < stats.accepted < stats.drafted  # drafts kept and drafts rejected, both on the way to AR's tokens
    assert stats.new_tokens == 40 and stats.drafted == 5 * stats.steps
    assert set(stats.model_calls) == {"target", "eagle_head"}
    assert stats.tier_counts.keys() == {"full"}


# ----------------------------------------------------------------------------- tiered, on tree paths
@pytest.mark.parametrize("tau", [0.0, 0.3])
def test_tiered_with_a_perfect_slim_verifier_stays_lossless(accepting_pair, tau):
    """u = the target itself: tier 1 keeps only q's argmax, tier 2 writes q's argmax."""
    ea = _stock(accepting_pair)
    stock = ea.eagenerate(PROMPT, max_new_tokens=40)
    tiered = TieredEagle(ea, routing=RoutingMask.none(), policy=ConfidencePolicy(tau, 0.0, tau), max_unverified=8)
    ours = tiered.eagenerate(PROMPT, max_new_tokens=40)
    # eagenerate stops at the first step past max_new_tokens, so lengths may differ past 40
    n = PROMPT.shape[1] + 40
    assert stock.shape[1] >= n and ours.shape[1] >= n
    assert torch.equal(stock[:, :n], ours[:, :n])
    stats = EagleDecoder(ea_model=ea, verifier=tiered.verifier).generate(PROMPT, 40).stats
    assert stats.tier_counts[Tier.ACCEPT] > 0 and stats.tier_counts[Tier.ESCALATE] > 0  # u kept drafts, q others


def test_tiered_decoder_counts_tiers_and_calls(tiny_pair):
    _, target, head = tiny_pair
    model = _target(tiny_pair)
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    decoder = EagleDecoder(
        target=model, head=head, routing=RoutingMask.none(), policy=ConfidencePolicy(0.0, 0.0, 0.0), max_unverified=8
    )
    result = decoder.generate(PROMPT, 40)
    assert result.tokens == ar.tokens
    counts = result.stats.tier_counts
    assert counts["slim"] > 0 and counts["full"] > 0  # the drift cap forces the full model now and then
    calls = result.stats.model_calls
    assert calls["slim"].calls > 0 and calls["target"].calls >= 2  # the prefill, then escalations


def test_tiered_with_a_routed_slim_verifier_runs_and_stops(tiny_pair):
    _, target, head = tiny_pair
    model = _target(tiny_pair)
    decoder = EagleDecoder(
        target=model, head=head, routing=RoutingMask(skip_layers=(2,)), policy=ConfidencePolicy(0.2, 0.0, 0.2)
    )
    result = decoder.generate(PROMPT, 30, stop_token_ids=())
    assert result.stats.new_tokens == 30 == len(result.tokens)
    assert sum(result.stats.tier_counts.values()) > 0


def test_eagle_and_sd_run_the_tiers_through_one_tiered_verifier_object(tiny_pair):
    """The verifier SD gets is the one EAGLE's tree goes to: its tiers, room and counts, its slim view."""
    from tests.conftest import perturbed
    from viasd_adapters.api import describe
    from viasd_adapters.decode import SpeculativeDecoder
    from viasd_adapters.draft import ModelDrafter
    from viasd_adapters.routing import SlimModel
    from viasd_adapters.verify import TieredVerifier

    _, target, head = tiny_pair
    model = _target(tiny_pair)
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40).tokens
    verifier = TieredVerifier(
        model, SlimModel(model, RoutingMask.none()), ConfidencePolicy(0.0, 0.0, 0.0), max_unverified=8
    )
    eagle = EagleDecoder(target=model, head=head, verifier=verifier)
    assert eagle.verifier is verifier
    tree = eagle.generate(PROMPT, 40)
    assert tree.tokens == ar  # u = q: lossless
    assert tree.stats.model_calls["slim"] is verifier.stats["slim"] and verifier.stats["slim"].calls > 0
    counts = tree.stats.tier_counts
    assert counts[Tier.SLIM] > 0 and counts[Tier.ESCALATE] > 1  # u rewrites; the drift cap forces q now and then
    assert sum(counts.values()) >= 40 and 0 < tree.stats.settled < tree.stats.steps
    chain = SpeculativeDecoder(ModelDrafter(perturbed(model, 0.02)), verifier, num_draft_tokens=4).generate(PROMPT, 40)
    assert chain.tokens == ar and chain.stats.tier_counts[Tier.SLIM] > 0 and chain.stats.settled > 0
    stock = EagleDecoder(target=model, head=head)
    assert (describe(eagle), describe(stock)) == ("VIA-SD on EAGLE", "EAGLE")
    off = stock.generate(PROMPT, 40)
    assert off.stats.settled == 0 and off.stats.steps > 0  # stock EAGLE: every round is the full model's


def test_eagle_streams_and_truncates_at_the_context_window_like_the_other_loops(tiny_pair, monkeypatch, caplog):
    _, target, head = tiny_pair
    decoder = EagleDecoder(
        target=_target(tiny_pair), head=head, routing=RoutingMask.none(), policy=ConfidencePolicy(0.3, 0.0, 0.3)
    )
    chunks = []

    class Recorder:
        def put(self, ids):
            chunks.append(ids.reshape(-1).tolist())

        def end(self):
            chunks.append("end")

    out = decoder.generate(PROMPT, 25, streamer=Recorder())
    assert chunks[0] == PROMPT[0].tolist() and chunks[-1] == "end"
    assert sum(chunks[1:-1], []) == out.tokens and len(out.tokens) == 25
    monkeypatch.setattr(decoder.model.config, "max_position_embeddings", PROMPT.shape[1] + 12)
    with caplog.at_level("WARNING"):
        assert len(decoder.generate(PROMPT, 40).tokens) == 12
    assert "exceeds the context window" in caplog.text


def test_tiers_on_eagle_llms_own_llama_are_refused_with_the_loader_to_use(tiny_pair):
    if tiny_pair[0] != "llama":
        pytest.skip("eagle-llm's own loader handles Llama only")
    with pytest.raises(ValueError, match="backend='transformers'"):
        TieredEagle(_stock(tiny_pair, "eagle"), routing=RoutingMask.none(), policy=ConfidencePolicy())
    ea = _stock(tiny_pair, "eagle")
    assert torch.equal(TieredEagle(ea).eagenerate(PROMPT, max_new_tokens=20), ea.eagenerate(PROMPT, max_new_tokens=20))


def test_decoder_sampling_is_reproducible_and_leaves_global_rng_alone(tiny_pair):
    _, target, head = tiny_pair
    model = _target(tiny_pair)
    decoder = EagleDecoder(target=model, head=head, routing=RoutingMask.none(), policy=ConfidencePolicy(0.5, 0, 0.5))
    before = torch.get_rng_state(), random.getstate()
    a = decoder.generate(PROMPT, 20, SamplingConfig(temperature=0.8, seed=3))
    b = decoder.generate(PROMPT, 20, SamplingConfig(temperature=0.8, seed=3))
    assert a.tokens == b.tokens
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]


@pytest.fixture(scope="module")
def peaked_eagle(tmp_path_factory):
    """(EaModel, exact marginals [3, V] of the first 3 sampled tokens after PROMPT) of a tiny
    Llama peaked enough that the tiers matter."""
    tmp_path = tmp_path_factory.mktemp("peaked-eagle")
    loaded = tiny(seed=0, architecture="llama", init_std=0.5)  # peaked enough that the tiers matter
    loaded.model.save_pretrained(tmp_path / "target")
    loaded.tokenizer.save_pretrained(tmp_path / "target")
    config = head_config(loaded.model.config, intermediate_size=96)
    torch.manual_seed(0)
    save_head(build_head(config), config, tmp_path / "head", full=False, compact=True)
    ea = load_ea_model(tmp_path / "target", tmp_path / "head")
    return ea, exact_marginals(ea.base_model.target, PROMPT, 3)


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_tiered_sampling_with_a_perfect_slim_verifier_samples_the_target(peaked_eagle):
    """Statistical: u = q and active tiers, so the 2nd and 3rd sampled tokens (the 1st is the
    prefill's) follow the target's exact marginals; the slim tier settles many of them."""
    ea, exact = peaked_eagle
    decoder = EagleDecoder(ea_model=ea, routing=RoutingMask.none(), policy=ConfidencePolicy(0.3, 0.0, 0.3))
    M = 500
    counts, tiers = torch.zeros_like(exact), {}
    for seed in range(M):
        out = decoder.generate(PROMPT, 3, SamplingConfig(temperature=1.0, seed=seed))
        counts[torch.arange(3), torch.tensor(out.tokens)] += 1
        for tier, n in out.stats.tier_counts.items():
            tiers[tier] = tiers.get(tier, 0) + n
    assert tiers[Tier.SLIM] > M // 2 and tiers[Tier.ESCALATE] > M  # u settled tokens, q others (the prefill's)
    assert float(exact[1].max()) < 0.5  # the 2nd token is far from certain
    for i in (1, 2):
        assert chi_square_p(counts[i], exact[i]) > P_MIN, i


def test_stop_token_ends_the_generation(tiny_pair):
    _, target, head = tiny_pair
    model = _target(tiny_pair)
    decoder = EagleDecoder(target=model, head=head)
    full = decoder.generate(PROMPT, 20).tokens
    stop = full[5]
    cut = decoder.generate(PROMPT, 20, stop_token_ids=(stop,)).tokens
    assert cut == full[: full.index(stop) + 1]


def test_a_custom_tree_is_grown_by_the_head_and_stays_lossless(accepting_pair):
    from eagle.model.utils_c import generate_tree_buffers as head_tree_buffers

    _, target, head = accepting_pair
    model = _target(accepting_pair)
    tree = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]  # depth 3, not mc_sim_7b_63's 5
    decoder = EagleDecoder(target=model, head=head, tree=tree)
    ea_layer = decoder.model.ea.ea_layer
    forwards = []
    hook = ea_layer.register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        out = decoder.generate(PROMPT, 30)
    finally:
        hook.remove()
    assert out.tokens == AutoregressiveDecoder(model).generate(PROMPT, 30).tokens
    growths = out.stats.model_calls["eagle_head"].calls + 1  # + the prefill's
    levels = len(head_tree_buffers(tree, device="cpu")["tree_indices"])
    assert len(forwards) == growths * (1 + levels)  # one forward per level of *this* tree
    assert out.stats.drafted == 3 * out.stats.steps and 0 < out.stats.accepted < out.stats.drafted
    assert ea_layer.tree == mc_sim_7b_63 and "topK_genrate" not in ea_layer.__dict__  # left as it was


def test_a_one_level_tree_drafts_from_the_head_s_first_forward_alone(accepting_pair):
    """Siblings only (what a profile with dear head steps picks): no growth level, lossless."""
    model = _target(accepting_pair)
    decoder = EagleDecoder(target=model, head=accepting_pair[2], tree=[[0], [1], [2]])
    forwards = []
    hook = decoder.model.ea.ea_layer.register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        out = decoder.generate(PROMPT, 30)
    finally:
        hook.remove()
    assert out.tokens == AutoregressiveDecoder(model).generate(PROMPT, 30).tokens
    assert len(forwards) == out.stats.model_calls["eagle_head"].calls + 1  # one forward a round (+ the prefill's)
    assert 0 < out.stats.accepted < out.stats.drafted


# ----------------------------------------------------------------------------- reduced draft vocabulary
def _vocabulary(model, exclude=()) -> DraftVocabulary:
    V = model.config.vocab_size
    return DraftVocabulary([i for i in range(0, V, 2) if i not in set(exclude)], V)


def test_a_generation_counts_acceptance_by_depth_and_rank_on_its_tree(accepting_pair):
    """Each round's accepted path is read off eagle-llm's node order: its nodes are the drafts kept,
    at their depths, and every node taken was on offer."""
    tree = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    _, target, head = accepting_pair
    stats = EagleDecoder(target=_target(accepting_pair), head=head, tree=tree).generate(PROMPT, 40).stats
    ranks = stats.tree_ranks
    assert ranks.rounds == stats.steps
    assert sum(ranks.taken.values()) == stats.accepted > 0
    assert sum(n for (depth, _), n in ranks.taken.items() if depth == 1) <= stats.steps
    assert all(ranks.taken[key] <= ranks.offered[key] for key in ranks.taken)
    assert {depth for depth, _ in ranks.offered} <= {1, 2, 3}
    assert json.loads(json.dumps(stats.to_dict()))["tree_ranks"]["taken"]


def test_vocabulary_draft_head_scores_the_kept_ids_as_the_lm_head_does(tiny_pair):
    model = _target(tiny_pair)
    vocab = _vocabulary(model)
    head = VocabularyDraftHead(model, vocab)
    hidden = torch.randn(3, model.config.hidden_size)
    full, restricted = model.get_output_embeddings()(hidden), head(hidden)
    kept = torch.tensor(vocab.token_ids)
    assert restricted.shape == full.shape
    torch.testing.assert_close(restricted[:, kept], full[:, kept])
    outside = torch.ones(full.shape[1], dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(restricted[:, outside]).all()


def test_reduced_vocabulary_eagle_drafts_only_kept_ids_and_stays_lossless(accepting_pair):
    _, target, head = accepting_pair
    model = _target(accepting_pair)
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    vocab = _vocabulary(model)
    decoder = EagleDecoder(target=model, head=head, vocabulary=vocab)
    scored = []
    hook = decoder.model.draft_head.register_forward_hook(lambda module, args, out: scored.append(out))
    try:
        out = decoder.generate(PROMPT, 40)
    finally:
        hook.remove()
    assert out.tokens == ar.tokens  # fp32, greedy: the target's tokens whatever the draft proposes
    assert 0 < out.stats.accepted < out.stats.drafted  # kept ids are accepted, the others never drafted
    assert len(scored) >= out.stats.model_calls["eagle_head"].calls > 0  # every tree growth scored with it
    kept = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    kept[vocab.token_ids] = True
    assert all(torch.isneginf(logits[..., ~kept]).all() for logits in scored)
    assert "topK_genrate" not in decoder.model.ea.ea_layer.__dict__  # the EaModel is left as it was


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_reduced_vocabulary_eagle_sampling_samples_the_target(peaked_eagle):
    """Statistical: the proposal is renormalised over the kept ids, the target's likeliest 2nd
    token among those left out, so only exact residual sampling gives the target's marginals."""
    ea, exact = peaked_eagle
    likeliest = exact[1].topk(3).indices.tolist()
    decoder = EagleDecoder(ea_model=ea, vocabulary=_vocabulary(ea.base_model.target, exclude=likeliest))
    M = 500
    counts = torch.zeros_like(exact)
    for seed in range(M):
        out = decoder.generate(PROMPT, 3, SamplingConfig(temperature=1.0, seed=seed))
        counts[torch.arange(3), torch.tensor(out.tokens)] += 1
    assert float(exact[1, likeliest].sum()) > 0.2  # the left-out ids matter
    for i in (1, 2):
        assert chi_square_p(counts[i], exact[i]) > P_MIN, i


# ----------------------------------------------------------------------------- decide_tree, by hand
def _tree(tokens_per_node: list[int]) -> DraftTree:
    """mc_sim_7b_63 with these tokens at its nodes (node 0 the root), as the adapter hands it on."""
    buffers = eagle_utils.generate_tree_buffers(mc_sim_7b_63, device="cpu")
    nodes = torch.tensor(tokens_per_node)
    return draft_tree(nodes[None], _parents(buffers["retrieve_indices"], nodes.numel()))


def _u(tree: DraftTree, favourite: dict[int, tuple[int, float]], V: int = 50) -> torch.Tensor:
    """[N + 1, V]: at node n, token favourite[n][0] gets probability favourite[n][1], the rest is uniform."""
    u = torch.full((len(tree) + 1, V), 1.0 / V)
    for n, (token, prob) in favourite.items():
        u[n] = (1 - prob) / (V - 1)
        u[n, token] = prob
    return u


NODES = list(range(10, 36))  # node n drafts token 10 + n (all distinct)


GREEDY = Sampler(SamplingConfig())


def _decide(tree, u, tau=0.9, room=16):
    return decide_tree(ConfidencePolicy(tau, 0.0, tau), tree, SlimScores.of(u.log(), GREEDY), GREEDY, room)


def test_decide_tree_accepts_the_longest_agreeing_path():
    tree = _tree(NODES)
    # the deepest path is 0 -> 1 -> 5 -> 13 -> 21 -> 24: u at each parent favours that child
    u = _u(tree, {0: (11, 0.99), 1: (15, 0.99), 5: (23, 0.99), 13: (31, 0.99), 21: (34, 0.99)})
    chosen = _decide(tree, u)
    assert chosen.decision.tier == Tier.ACCEPT and chosen.decision.num_accepted == 5
    assert chosen.decision.token is None  # u at the leaf is not confident: no bonus token
    assert (chosen.path + 1).tolist() == [1, 5, 13, 21, 24]  # draft n is node n + 1


def test_decide_tree_adds_a_confident_bonus_token_within_the_drift_cap():
    tree = _tree(NODES)
    u = _u(tree, {0: (11, 0.99), 1: (15, 0.99), 5: (23, 0.99), 13: (31, 0.99), 21: (34, 0.99), 24: (7, 0.99)})
    chosen = _decide(tree, u)
    assert chosen.decision.tier == Tier.ACCEPT and chosen.decision.token == 7
    capped = _decide(tree, u, room=5)  # a sixth token would put the target 6 behind
    assert capped.decision.tier == Tier.ACCEPT and capped.decision.num_accepted == 5 and capped.decision.token is None
    short = _decide(tree, u, room=3)
    assert short.decision.tier == Tier.ESCALATE and short.decision.num_accepted == 3


def test_decide_tree_slim_rewrite_after_the_accepted_prefix():
    tree = _tree(NODES)
    u = _u(tree, {0: (12, 0.99), 2: (49, 0.95)})  # node 2 accepted; then u wants a token no child drafts
    chosen = _decide(tree, u)
    assert chosen.decision.tier == Tier.SLIM and chosen.decision.num_accepted == 1 and chosen.decision.token == 49
    assert int(chosen.path[0]) + 1 == 2


def test_decide_tree_escalates_an_uncertain_first_token():
    tree = _tree(NODES)
    chosen = _decide(tree, _u(tree, {0: (11, 0.5)}))
    assert chosen.decision.tier == Tier.ESCALATE and chosen.decision.num_accepted == 0


def test_decide_tree_sampling_settles_tokens_distributed_as_u():
    """Statistical: u judges the tree's deterministic drafts by speculative sampling (p one-hot), so
    the first token follows u at the root and the second, after a kept draft, u at that draft."""
    tree = _tree(NODES)
    V = 50
    u = torch.softmax(torch.randn(len(tree) + 1, V, generator=torch.Generator().manual_seed(3)) * 1.5, -1)
    u[0] = 0.3 / (V - 2)
    u[0, 11], u[0, 12] = 0.5, 0.2  # u's top at the root is drafted (node 1), as is its second (node 2)
    policy = ConfidencePolicy(0.0, 0.0, 0.0)  # u settles everything
    M = 3000
    first, second = torch.zeros(V), torch.zeros(V)
    for seed in range(M):
        sampler = Sampler(SamplingConfig(temperature=1.0, seed=seed))
        chosen = decide_tree(policy, tree, SlimScores.of(u.log(), sampler), sampler, 16)
        d = chosen.decision
        tokens = tree.tokens[chosen.path[: d.num_accepted]].tolist() + [d.token]
        assert d.tier != Tier.ESCALATE and None not in tokens
        first[tokens[0]] += 1
        if tokens[0] == 11:
            second[tokens[1]] += 1
    assert first[11] > 0.4 * M and second.sum() > 0.4 * M  # the old rule kept node 1 every time
    assert chi_square_p(first, u[0]) > P_MIN
    assert chi_square_p(second, u[1]) > P_MIN  # node 1 drafted 11: u's next distribution is u[1]


# ----------------------------------------------------------------------------- integration pieces
def test_a_missing_head_says_how_to_train_and_pass_one(tiny_pair, tmp_path):
    with pytest.raises(ValueError, match="viasd-train-eagle .*framework.decoder.head=FOLDER"):
        EagleDecoder(target=_target(tiny_pair), head=tmp_path / "no-head")


def test_a_routing_mask_that_is_neither_yaml_nor_a_config_name_is_refused(tiny_pair, tmp_path):
    (tmp_path / "mask.json").write_text("{}")
    for routing in (tmp_path / "mask.json", "no-such-mask"):
        with pytest.raises(
            ValueError, match="no routing mask .*: give a RoutingMask, a mask YAML file .*tiny-random-1l"
        ):
            TieredEagle(_stock(tiny_pair), routing=routing, policy=ConfidencePolicy())


def test_policy_without_routing_is_refused(tiny_pair):
    with pytest.raises(ValueError, match="routing"):
        TieredEagle(_stock(tiny_pair), policy=ConfidencePolicy())


def test_eagle_backend_refuses_non_llama_targets(tiny_pair):
    arch, target, head = tiny_pair
    if arch == "llama":
        pytest.skip("Llama loads")
    with pytest.raises(ValueError, match="Mixtral"):
        load_ea_model(target, head, backend="eagle")


def test_compact_head_shares_the_target_embeddings_and_exports_to_eagle_format(tiny_pair, tmp_path):
    _, target, head = tiny_pair
    ea = _stock(tiny_pair)
    assert ea.ea_layer.embed_tokens.weight is ea.base_model.model.embed_tokens.weight
    out = export_head(head, ea.base_model.model.embed_tokens.weight, tmp_path / "eagle-format")
    assert (out / FULL_WEIGHTS).is_file()
    # the exported folder is what eagle-llm's own loader reads (strictly)
    if tiny_pair[0] == "llama":
        stock = EaModel.from_pretrained(base_model_path=str(target), ea_model_path=str(out)).eval()
        assert torch.equal(stock.eagenerate(PROMPT, max_new_tokens=20), ea.eagenerate(PROMPT, max_new_tokens=20))


def test_kv_buffers_keep_moves_the_accepted_path():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=8, intermediate_size=8
    )
    kv = KVBuffers(config, [0, 1], max_length=16, dtype=torch.float32, device="cpu")
    for k in range(2):
        kv.caches[0][k].cat(torch.arange(10.0).reshape(1, 1, 10, 1).expand(1, 1, 10, 4))
        kv.caches[1][k].cat(torch.arange(10.0).reshape(1, 1, 10, 1).expand(1, 1, 10, 4))
    kv.keep(4, torch.tensor([4, 7, 9]))
    assert kv.length == 7
    assert kv.caches[1][0].data[0, 0, 4:7, 0].tolist() == [4.0, 7.0, 9.0]


def test_kv_buffers_share_no_storage():
    """The compiled step writes a layer's keys and values in place: were they views of one tensor
    (eagle-llm's layout), torch.compile would copy that storage in and out around every layer call."""
    config = transformers.LlamaConfig(
        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, hidden_size=8, intermediate_size=8
    )
    kv = KVBuffers(config, [0, 2], max_length=16, dtype=torch.float32, device="cpu")
    storages = {p.data.untyped_storage().data_ptr() for pair in kv.caches if pair is not None for p in pair}
    assert len(storages) == 4


def test_transformers_base_features_match_the_model(tiny_pair):
    model = _target(tiny_pair)
    base = TransformersEagleBase(model)
    with torch.no_grad():
        ours = base.lm_head(base.model(input_ids=PROMPT)[0])
        theirs = model(PROMPT).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- config groups
@pytest.fixture(scope="module")
def tiny_random_eagle(tmp_path_factory):
    """The tiny-random pair loaded once, and overrides giving its target a random head and a tokenizer folder."""
    from viasd_adapters.pipeline import load_pair

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        pair = load_pair(
            compose(config_name="generate", overrides=["model_pair=tiny-random"]).model_pair, with_draft=False
        )
    root = tmp_path_factory.mktemp("tiny-random-eagle")
    config = head_config(pair.target.model.config, intermediate_size=32)
    torch.manual_seed(0)
    save_head(build_head(config), config, root / "head", full=False, compact=True)
    pair.target.tokenizer.save_pretrained(root / "tokenizer")
    return pair, {"head": str(root / "head"), "tokenizer_path": str(root / "tokenizer")}


def _eagle_decoder(tiny_random_eagle, *overrides, prefix="framework"):
    from viasd_adapters.pipeline import build_decoder

    pair, files = tiny_random_eagle
    config = "bench" if prefix != "framework" else "generate"
    keys = [f"{prefix}.decoder.{k}={v}" for k, v in files.items()]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name=config, overrides=["model_pair=tiny-random", "runtime.weights=float32", *overrides, *keys]
        )
    node = cfg if prefix == "framework" else cfg.method[prefix.split(".")[1]]
    return cfg, build_decoder(node.framework, node.verifier, pair)


@pytest.mark.parametrize("method", ["eagle", "eagle-vocab", "eagle-tiered"])
def test_eagle_bench_methods_take_the_verifier_routing_and_policy_groups(tiny_random_eagle, method):
    from hydra.utils import instantiate

    pair, _ = tiny_random_eagle
    cfg, decoder = _eagle_decoder(tiny_random_eagle, f"method=[{method}]", prefix=f"method.{method}.framework")
    assert isinstance(decoder, EagleDecoder)
    ids = torch.tensor([[10, 20, 30, 40]])
    out = decoder.generate(ids, 30)
    assert (decoder.model.draft_head is not None) == (method == "eagle-vocab")  # the pair's draft vocabulary
    if method != "eagle-tiered":  # verifier=full: stock EAGLE, lossless (fp32: AR's tokens)
        assert isinstance(decoder.verifier, LosslessVerifier)
        assert out.tokens == AutoregressiveDecoder(pair.target.model).generate(ids, 30).tokens
    else:  # verifier=tiered: the pair's policy and routing mask drive the tree's tiers
        assert decoder.verifier.policy == instantiate(cfg.policy)
        assert decoder.verifier.slim.model.mask.skip_layers == instantiate(cfg.routing).skip_layers != ()
        assert out.stats.model_calls["slim"].calls > 0 and len(out.tokens) == 30


def test_framework_eagle_with_verifier_tiered_is_tiered_eagle(tiny_random_eagle):
    """`framework=eagle verifier=tiered` used to build stock EAGLE silently."""
    from hydra.utils import instantiate

    cfg, tiered = _eagle_decoder(
        tiny_random_eagle,
        "framework=eagle",
        "verifier=tiered",
        "verifier.max_unverified=5",
        "verifier.rejudge=false",
        "policy.tau_slim=0.5",
    )
    assert tiered.verifier.policy == instantiate(cfg.policy) and tiered.verifier.policy.tau_slim == 0.5
    assert tiered.verifier.max_unverified == 5 and tiered.verifier.rejudge is False
    _, full = _eagle_decoder(tiny_random_eagle, "framework=eagle", "verifier=full")
    assert isinstance(full.verifier, LosslessVerifier)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["verifier=faster-cascade"], "verifier=full .* or verifier=tiered"),
        (["verifier=tiered-intermediate"], "target's own layers"),
        (["verifier=tiered", "verifier.share_prefix=true", "routing=tiny-random-1l"], "share_prefix=false"),
    ],
)
def test_framework_eagle_refuses_verifiers_it_cannot_run(tiny_random_eagle, overrides, match):
    from viasd_adapters.pipeline import build_decoder

    pair, files = tiny_random_eagle
    keys = [f"framework.decoder.{k}={v}" for k, v in files.items()]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name="generate", overrides=["model_pair=tiny-random", "framework=eagle", *overrides, *keys]
        )
    if "pair.draft" in cfg.verifier.values():
        from viasd_adapters.pipeline import load_pair

        pair = load_pair(cfg.model_pair)  # the intermediate model is the pair's draft
    with pytest.raises(InstantiationException, match=match):  # Hydra's wrapper around the ValueError
        build_decoder(cfg.framework, cfg.verifier, pair)


# ----------------------------------------------------------------------------- head training
def test_head_training_runs_a_few_steps_and_resumes(tmp_path):
    from viasd_adapters.cli.train_eagle import run

    def cfg(steps):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            base = compose(
                config_name="train_eagle", overrides=["model_pair=tiny-random", "runtime.draft_weights=float32"]
            )
        base.out_dir = str(tmp_path / "head")
        base.progress = False
        t = base.training
        t.split.prompts = ["hello world", "the cat sat on", "def foo", "once upon a time", "1 2 3"]
        t.data.max_new_tokens = 16
        t.head.intermediate_size = 32
        t.train.steps = steps
        t.train.batch_tokens = 24
        t.train.save_every = 2
        t.train.eval_every = 3  # the checkpoint at step 2 holds no evaluation yet
        t.train.decode_tokens = 6
        t.corpus.eval_fraction = 0.4  # 2 of the 5 prompts held out: decoded at each evaluation
        return base

    first = run(cfg(2))
    assert first.steps == 2 and (tmp_path / "head" / "checkpoint.pt").is_file()
    generated = (tmp_path / "head" / "generations.jsonl").read_text()
    recipe = json.loads((tmp_path / "head" / "recipe.json").read_text())
    (tmp_path / "head" / "recipe.json").unlink()  # a run stopped in training writes no recipe
    second = run(cfg(4))
    assert second.steps == 4
    for stage in ("generate", "features", "train"):  # the first run's stage times are kept and added to
        assert second.seconds[stage] >= recipe["seconds"][stage] > 0
    assert (tmp_path / "head" / "generations.jsonl").read_text() == generated  # not generated again
    state = torch.load(tmp_path / "head" / "checkpoint.pt", weights_only=False)
    assert [h["step"] for h in state["history"]] == [1, 2, 3, 4]
    # the result is an eagle-llm head folder
    assert (tmp_path / "head" / "config.json").is_file() and (tmp_path / "head" / FULL_WEIGHTS).is_file()
    # every evaluation decoded the held-out prompts; the head written is the one with the most tokens per round
    recipe = json.loads((tmp_path / "head" / "recipe.json").read_text())
    evaluations = recipe["evaluations"]
    assert [e["step"] for e in evaluations] == [2, 3, 4] and all(e["tokens_per_round"] >= 1 for e in evaluations)
    assert recipe["rank_acceptance"]["offered"]
    assert recipe["machine"]["model"] and recipe["machine"]["logical_cores"] >= 1  # where the figures came from
    from safetensors.torch import load_file

    written, best = (
        load_file(tmp_path / "head" / "head.safetensors"),
        load_file(tmp_path / "head" / "best" / "head.safetensors"),
    )
    assert all(torch.equal(written[k], best[k]) for k in written)
    last = {k: v.half() for k, v in state["head"].items()}
    kept = max(evaluations, key=lambda e: e["tokens_per_round"])["step"]
    assert all(torch.equal(written[k], last[k]) for k in written) == (kept == 4)


def test_sampled_answers_are_seeded_resumed_and_held_out_with_their_prompt(tmp_path):
    from viasd_adapters.third_party.eagle import TransformersEagleBase
    from viasd_adapters.train.eagle import DataConfig, generate_answers
    from viasd_adapters.train.shards import CorpusConfig, complete, run_features, shard_sequences

    loaded = tiny(seed=0)
    prompts = [(f"p{i}", text) for i, text in enumerate(["hello world", "the cat", "def foo", "1 2 3", "abc"])]
    cfg = DataConfig(max_new_tokens=6, batch_size=2, sampled_answers=2, temperature=1.0, chat_template=False)
    first = generate_answers(loaded, prompts, cfg, tmp_path / "a.jsonl", progress=False)
    assert [g["id"] for g in first] == [f"p{i}" for i in range(5)] + [f"p{i}#{k}" for k in (1, 2) for i in range(5)]
    again = generate_answers(loaded, prompts, cfg, tmp_path / "b.jsonl", progress=False)
    assert again == first  # seeded
    other = generate_answers(
        loaded, prompts, DataConfig(**{**cfg.__dict__, "seed": 1}), tmp_path / "c.jsonl", progress=False
    )
    assert [g["answer_ids"] for g in other[5:]] != [g["answer_ids"] for g in first[5:]]
    assert [g["answer_ids"] for g in other[:5]] == [g["answer_ids"] for g in first[:5]]  # greedy: unseeded
    lines = (tmp_path / "a.jsonl").read_text()
    assert generate_answers(loaded, prompts, cfg, tmp_path / "a.jsonl", progress=False) == first
    assert (tmp_path / "a.jsonl").read_text() == lines  # nothing generated twice

    # features: the plan holds every answer; held-out prompts go with all their answers
    corpus = CorpusConfig(self_distill=True, eval_fraction=0.4, sequences_per_shard=4)
    plan, manifest = run_features(loaded, corpus, tmp_path / "f", first, data_max_seq_len=64, progress=False)
    held = {s["group"] for s in plan["heldout"]}
    assert len(held) == 2 and not held & {s["group"] for s in plan["train"]}
    assert len(plan["heldout"]) == 2 and not any(s["sampled"] for s in plan["heldout"])
    assert len(plan["train"]) == 3 * 3
    assert complete(manifest) and manifest["planned"] == {"heldout": 1, "train": 3}
    for s in plan["train"]:  # the loss mask covers the answer, cut with its prompt to max_seq_len
        g = next(g for g in first if g["id"] == s["id"])
        assert s["ids"].tolist() == (g["prompt_ids"] + g["answer_ids"])[:64]
        assert s["loss_mask"].tolist() == [i >= len(g["prompt_ids"]) for i in range(len(s["ids"]))]
    # the shards hold what eagle-llm's base model computes (what the head reads while decoding)
    base = TransformersEagleBase(loaded.model)
    row = next(shard_sequences(torch.load(tmp_path / "f" / "train-00000.pt", weights_only=False)))
    with torch.no_grad():
        expect = base.model(input_ids=row["ids"][None])[0][0].half()
    torch.testing.assert_close(row["features"], expect)


def test_sampled_answers_need_a_positive_temperature():
    from viasd_adapters.train.eagle import DataConfig

    with pytest.raises(ValueError, match="temperature"):
        DataConfig(sampled_answers=1, temperature=0.0)
    with pytest.raises(ValueError, match="sampled_answers"):
        DataConfig(sampled_answers=-1)


# ----------------------------------------------------------------------------- real models
def _smollm2():
    """SmolLM2-135M-Instruct's cached folder, converted from its PyPI package here if needed (so
    a fresh checkout runs this), and its shipped EAGLE head."""
    from viasd_adapters.models import ModelSpec, load_model
    from viasd_adapters.models.offline import cache_dir

    folder = cache_dir("smollm2-135m-instruct")
    if not (folder / "config.json").is_file():
        load_model(ModelSpec("smollm2-135m-instruct", weights="float32"))  # converts and caches it
    head = SHIPPED_HEADS / "smollm2-135m-instruct"
    assert (folder / "config.json").is_file() and (head / "config.json").is_file()
    return folder, head


def test_smollm2_slim_off_matches_stock_eagenerate_and_tiers_run():
    folder, head = _smollm2()
    ea = load_ea_model(folder, head, dtype=torch.float32)
    tok = ea.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt"
    )
    stock = ea.eagenerate(ids, max_new_tokens=24)
    assert torch.equal(TieredEagle(ea).eagenerate(ids, max_new_tokens=24), stock)
    perfect = TieredEagle(ea, routing=RoutingMask.none(), policy=ConfidencePolicy(0.5, 0.0, 0.5))
    out = perfect.eagenerate(ids, max_new_tokens=24)
    n = ids.shape[1] + 24  # eagenerate may overshoot max_new_tokens by part of a step, or stop at EOS
    if stock.shape[1] < n:  # stock stopped at EOS: the tiered output must stop there too
        n = stock.shape[1]
        assert out.shape[1] == n
    assert out.shape[1] >= n and torch.equal(out[:, :n], stock[:, :n])


@pytest.mark.slow
def test_smollm2_stock_loader_slim_off_identity_and_routed_tiers():
    folder, head = _smollm2()
    ea = load_ea_model(folder, head, backend="eagle", dtype=torch.float32)
    ids = ea.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about the sea."}], add_generation_prompt=True, return_tensors="pt"
    )
    stock = ea.eagenerate(ids, max_new_tokens=48)
    assert torch.equal(TieredEagle(ea).eagenerate(ids, max_new_tokens=48), stock)
    with pytest.raises(ValueError, match="backend='transformers'"):  # the slim view runs transformers layers
        TieredEagle(ea, routing=RoutingMask(skip_layers=(14,)), policy=ConfidencePolicy(0.9, 0.0, 0.9))
    routed = TieredEagle(
        load_ea_model(folder, head, dtype=torch.float32),
        routing=RoutingMask(skip_layers=(14,)),
        policy=ConfidencePolicy(0.9, 0.0, 0.9),
    )
    assert routed.eagenerate(ids, max_new_tokens=48).shape[1] > ids.shape[1]
    assert routed.stats["slim"].calls > 0


@pytest.mark.slow
def test_qwen2_coder_eagle_tree_decoding_on_the_transformers_base(tmp_path):
    """Qwen2.5-Coder-1.5B (eagle-llm alone would load it as Mixtral): any head is lossless."""
    from viasd_adapters.models import ModelSpec, load_model
    from viasd_adapters.models.offline import cache_dir

    if not (cache_dir("qwen2.5-coder-1.5b-instruct") / "config.json").is_file():
        pytest.skip("Qwen2.5-Coder-1.5B-Instruct is not converted")
    loaded = load_model(ModelSpec("qwen2.5-coder-1.5b-instruct", weights="bfloat16"))
    head = SHIPPED_HEADS / "qwen2.5-coder-1.5b-instruct"
    if not (head / "config.json").is_file():  # untrained: acceptance suffers, correctness must not
        config = head_config(loaded.model.config, intermediate_size=256)
        torch.manual_seed(0)
        head = save_head(build_head(config), config, tmp_path / "head", full=False)
    ids = loaded.tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    ea = ea_model_from_target(loaded.model, head)
    stock = ea.eagenerate(ids, max_new_tokens=16)
    assert torch.equal(TieredEagle(ea).eagenerate(ids, max_new_tokens=16), stock)
    ar = AutoregressiveDecoder(loaded.model).generate(ids, 16).tokens
    eagle = stock[0, ids.shape[1] :].tolist()[:16]
    # bf16: a tree forward and a one-token forward may round apart at a near-tie; never early on
    assert eagle[:8] == ar[:8]


def test_eagle_on_the_int8_target_reproduces_int8_ar(accepting_pair):
    """The int8 target (W8A8, row-by-row attention) verifies EAGLE's tree: a tree row attends under
    its own mask row, and its tokens still equal int8 AR's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from viasd_adapters.models.quantize import calibrate_outliers, quantize_linears
    from viasd_adapters.models.row_attention import ROW_INVARIANT_ATTENTION

    _, target, head = accepting_pair
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    quantize_linears(model, "int8", outliers=calibrate_outliers(model, AutoTokenizer.from_pretrained(target)))
    model.config._attn_implementation = ROW_INVARIANT_ATTENTION
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    eagle = EagleDecoder(target=model, head=head).generate(PROMPT, 40)
    assert eagle.tokens == ar.tokens
    assert 0 < eagle.stats.accepted < eagle.stats.drafted


def test_the_head_on_an_int8_target_drafts_in_int8_and_accepts_as_its_float_self(accepting_pair):
    """On an int8 target the head's layers run in the target's W8A8 kernels (outlier channels of
    fc and down_proj calibrated); the output is still int8 AR's, and the int8 head's drafts are
    accepted about as often as the float head's (the same head: it copies the target's layer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from viasd_adapters.models.quantize import Int8Linear, calibrate_outliers, quantize_linears
    from viasd_adapters.models.row_attention import ROW_INVARIANT_ATTENTION

    _, target, head = accepting_pair
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    quantize_linears(model, "int8", outliers=calibrate_outliers(model, AutoTokenizer.from_pretrained(target)))
    model.config._attn_implementation = ROW_INVARIANT_ATTENTION
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    int8 = EagleDecoder(target=model, head=head)
    layer = int8.model.ea_layer
    assert isinstance(layer.fc, Int8Linear) and layer.fc.channels is not None  # outliers of the features
    assert isinstance(layer.layers[0].mlp.down_proj, Int8Linear)
    as_loaded = EagleDecoder(target=model, head=head, head_precision="as-loaded")
    assert isinstance(as_loaded.model.ea_layer.fc, torch.nn.Linear)
    quantized, floating = int8.generate(PROMPT, 40), as_loaded.generate(PROMPT, 40)
    assert quantized.tokens == floating.tokens == ar.tokens
    assert 0 < quantized.stats.accepted < quantized.stats.drafted
    assert quantized.stats.accepted >= 0.8 * floating.stats.accepted


def test_a_head_precision_that_is_not_one_of_the_choices_is_refused(tiny_pair):
    _, target, head = tiny_pair
    with pytest.raises(ValueError, match="head_precision='bf16'.*int8"):
        EagleDecoder(target=_target(tiny_pair), head=head, head_precision="bf16")


# Llama in the slow run only (these two tests): each architecture builds its packaged layers cold in
# CI (20-40 s a test), and the Qwen2 variants and the real pair's EAGLE test cover the same path.
LLAMA_SLOW = [pytest.param("llama", marks=pytest.mark.slow), "qwen2"]


@pytest.mark.parametrize("accepting_pair", LLAMA_SLOW, indirect=True)
def test_eagle_on_the_compiled_int8_target_reproduces_its_ar(accepting_pair):
    """EAGLE's tree rows go through the compiled decode step (a tree is a mask there) into EAGLE's own
    KV buffers, and its tokens equal the compiled int8 target's AR."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from viasd_adapters.models.compiled import attach_step
    from viasd_adapters.models.quantize import calibrate_outliers, quantize_linears

    _, target, head = accepting_pair
    # Another width compiled first, as the pipeline compiles the draft: the layer function's graphs
    # are shared, and a graph traced generic in the width once decoded the tree rows wrongly.
    other = tiny(seed=5, hidden_size=96, intermediate_size=160).model
    quantize_linears(other, "int8")
    attach_step(other)
    AutoregressiveDecoder(other).generate(PROMPT, 8)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    quantize_linears(model, "int8", outliers=calibrate_outliers(model, AutoTokenizer.from_pretrained(target)))
    step = attach_step(model)
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    decoder = EagleDecoder(target=model, head=head)
    assert decoder.model.ea.base_model.tree_layers.step is step
    eagle = decoder.generate(PROMPT, 40)
    assert eagle.tokens == ar.tokens
    assert 0 < eagle.stats.accepted < eagle.stats.drafted


@pytest.mark.parametrize("accepting_pair", LLAMA_SLOW, indirect=True)
def test_tiered_eagle_on_the_compiled_int8_target_scores_trees_on_the_compiled_view(accepting_pair):
    """u = the compiled target itself: its tree passes (score_tree) and path compaction (keep_path)
    run on the compiled step's buffers, and tiers 1-2 keep exactly q's greedy tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from viasd_adapters.models.compiled import attach_step
    from viasd_adapters.models.quantize import calibrate_outliers, quantize_linears

    _, target, head = accepting_pair
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    quantize_linears(model, "int8", outliers=calibrate_outliers(model, AutoTokenizer.from_pretrained(target)))
    attach_step(model)
    ar = AutoregressiveDecoder(model).generate(PROMPT, 40)
    decoder = EagleDecoder(
        target=model, head=head, routing=RoutingMask.none(), policy=ConfidencePolicy(0.3, 0.0, 0.3), max_unverified=8
    )
    assert decoder.model.verifier.slim.step is not None
    out = decoder.generate(PROMPT, 40)
    assert out.tokens == ar.tokens
    assert out.stats.tier_counts[Tier.ACCEPT] > 0 and out.stats.tier_counts[Tier.ESCALATE] > 0
