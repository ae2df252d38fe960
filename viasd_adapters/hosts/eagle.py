"""VIA-SD for EAGLE: eagle-llm 1.2.1's draft tree, verified tier by tier.

An existing eagle-llm deployment keeps its `EaModel` (target + draft head) and wraps it:

    model = EaModel.from_pretrained(base_model_path=..., ea_model_path=...)   # as before
    model = TieredEagle(model, routing=mask, policy=ConfidencePolicy())       # the upgrade
    output_ids = model.eagenerate(input_ids, temperature=0.0, max_new_tokens=256)

Each round (eagle-llm's `tree_decoding -> evaluate_posterior -> update_inference_inputs`, with
VIA-SD's tiers in between):

1. draft: the head's tree of N nodes (eagle-llm's `generate_candidates`); node 0 is the root, the
   token after the committed sequence; the P root-to-leaf paths have at most D drafts;
2. slim verify: the slim verifier u (the target's own layers, some skipped by the routing mask)
   runs once over [its lagging tokens + the tree] with the same tree mask and its own KV buffers;
   `decide_tree` picks a path from u alone (greedy: the longest tier-1 prefix) and settles its
   drafts with `decide`, the rule `TieredVerifier` applies to chains (verify/decision.py):
   - ACCEPT: the whole path is kept without the full model (u's next token too, when confident);
   - SLIM: the accepted prefix is kept and u's token replaces the next draft; the round ends;
   sampling, u judges the drafts with speculative sampling where the policy lets it;
3. escalate: otherwise the full target runs over [its lagging tokens + the tree] and eagle-llm's
   own `evaluate_posterior` judges the tree (greedy match or EAGLE's tree rejection sampling).
   Greedy, the drafts tier 1 accepted are re-judged with it; sampling (or `rejudge=False`) they
   are committed and the next round's tree, grown after them, goes to the full model;
4. commit: the KV buffers of the views that saw the tree keep the committed path (eagle-llm's
   compaction); the head reads the committed tokens' features (the slim's for tiers 1-2, replaced
   by the full model's once it catches up) and grows the next tree.

With `policy=None` steps 2 and the lag never occur and each round is exactly stock `eagenerate`'s:
the output is token-identical to it (greedy, and sampling under the same global seeds).

Terms: N tree nodes, P paths, D = max drafts on a path (`mc_sim_7b_63`: N 26, P 15, D 5), V vocab.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from ..compat import built_kind, check
from ..configs import ROUTING_FORMS, named_config
from ..decode import Decoder, DecodeStats, GenerationResult
from ..models.vocab import DraftVocabulary, VocabularyDraftHead
from ..routing import RoutingMask
from ..runner import CallStats
from ..sampling import Sampler, SamplingConfig
from ..verify import Tier, TieredVerifier, TierPolicy, Verifier
from ..verify.decision import SlimScores, TierDecision, decide

try:
    from eagle.model import choices as eagle_choices
    from eagle.model.ea_model import EaModel
    from eagle.model.utils_c import generate_tree_buffers as head_tree_buffers
    from eagle.model.utils import (
        evaluate_posterior,
        generate_candidates,
        generate_tree_buffers,
        initialize_tree,
        prepare_logits_processor,
        reset_tree_mode,
        update_inference_inputs,
    )

    from ..third_party import eagle as third_party_eagle
    from ..third_party.eagle import (
        KVBuffers,
        ea_model_from_target,
        extend_head,
        head_length,
        is_head_folder,
        layers_for,
        rewind_head,
        tree_growth,
    )
except ImportError as err:  # pragma: no cover - environment problem
    raise ImportError(
        f"the EAGLE host needs eagle-llm 1.2.1 ({err}): install it with"
        " `pip install --no-deps eagle-llm==1.2.1` (its declared pins are unusable; the `eagle` extra"
        " of viasd-adapters installs what it really imports)"
    ) from err

SHIPPED_HEADS = Path(third_party_eagle.__file__).resolve().parent / "heads"  # package data: one folder per target


# ----------------------------------------------------------------------------- tree and decisions
@dataclass
class DraftTree:
    """One round's draft tree, laid out as eagle-llm's `generate_candidates` returns it."""

    nodes: torch.Tensor  # [N] long: node 0 is the root, then the head's drafts
    paths: torch.Tensor  # [P, D + 1] long: node index at each depth of each root-to-leaf path; -1 pads
    candidates: torch.Tensor  # [P, D + 1] long: the tokens along each path; -1 pads
    parents: torch.Tensor  # [N] long: each node's parent node (-1 for the root)

    @property
    def depth(self) -> int:
        """D: the most drafts one path holds."""
        return self.paths.shape[1] - 1

    def path_length(self, j: int) -> int:
        """Drafts on path j."""
        return int((self.paths[j] >= 0).sum()) - 1


@dataclass
class TreeDecision:
    """What the slim tier decides for one tree (`decide_tree`): `decide`'s decision on one path."""

    path: int  # the row of `DraftTree.paths` the decision follows
    decision: TierDecision  # the tier, the drafts of that path kept, and u's token after them


def _parents(paths: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[N] long parent of each node of a tree given by its root-to-leaf `paths` ([P, D + 1], -1 pads)."""
    parent = [-1] * num_nodes
    for path in paths.tolist():
        for prev, node in zip(path, path[1:]):
            if node < 0:
                break
            parent[node] = prev
    return torch.tensor(parent, dtype=torch.long, device=paths.device)


def _one_hot(tokens: torch.Tensor, V: int) -> torch.Tensor:
    """[K, V] p of drafts the head chose deterministically (its top-k): speculative sampling stays exact."""
    return torch.zeros(tokens.numel(), V, device=tokens.device).scatter_(1, tokens[:, None], 1.0)


def choose_path(policy: TierPolicy, tree: DraftTree, u: SlimScores, greedy: bool, room: int) -> int:
    """The path the slim tier follows, a function of the tree and u alone (never of a random draw).

    Greedy: the longest tier-1 (ACCEPT) prefix within `room` (the first such path on ties).
    Sampling: the most drafts u is expected to accept, sum over depths d of the product of
    u(x_1) ... u(x_d) along the path, counting only positions the policy lets u settle. Choosing
    the path before any draw keeps the drafts' fate a plain speculative-sampling test against u.
    """
    parents, drafts = tree.parents[1:], tree.nodes[1:]  # [N - 1] each: node n at index n - 1
    u_raw = u.raw[parents]  # [N - 1, V], u at each draft's parent
    p = _one_hot(drafts, u_raw.shape[-1])
    if greedy:
        ok = policy.assign(drafts, p, u_raw) == Tier.ACCEPT.code  # [N - 1]
        gain = ok.float()
    else:
        ok = policy.settles(p, u_raw)
        gain = ok.float() * u.probs[parents, drafts]  # [N - 1]: probability u accepts the draft
    best, best_score = 0, -1.0
    for j in range(tree.paths.shape[0]):
        length = min(tree.path_length(j), max(room, 0))
        along = gain[tree.paths[j, 1 : length + 1] - 1]  # [length]
        score = float(along.cumprod(0).sum())  # greedy: the tier-1 prefix length
        if score > best_score:
            best, best_score = j, score
    return best


def decide_tree(policy: TierPolicy, tree: DraftTree, u_logits: torch.Tensor, sampler: Sampler,
                room: int) -> TreeDecision:
    """Tier decision of one tree from the slim logits at its nodes ([N, V]; row n scores the token after node n).

    The path is chosen first (`choose_path`); `decide` then settles its drafts as for a chain,
    with u at each draft's parent and u after the path's last node.
    """
    u = SlimScores.of(u_logits, sampler)
    j = choose_path(policy, tree, u, sampler.config.greedy, room)
    nodes = tree.paths[j, : tree.path_length(j) + 1]  # the root, then the path's drafts
    drafts = tree.nodes[nodes[1:]]
    return TreeDecision(j, decide(policy, drafts, _one_hot(drafts, u_logits.shape[-1]), u[nodes], sampler, room))


@dataclass
class RoundResult:
    """What one round committed (the prefill is round 0: one token, nothing drafted)."""

    tokens: list[int]  # new output tokens: accepted drafts, then the recovered / rewritten / bonus token
    num_accepted: int  # n: drafts committed unchanged
    num_drafted: int  # D of the tree (0 for the prefill)
    # every token of `tokens` counted once, under the tier that decided it (as `Verdict.tier_counts`)
    tier_counts: dict[Tier, int] = field(default_factory=dict)


@dataclass
class _Generation:
    """The state of one generation between rounds."""

    ids: torch.Tensor  # [1, T'] committed sequence (prompt + output), without the root
    root: torch.Tensor  # [1, 1] the next token: output already, not yet fed to any model
    head_out: tuple  # eagle-llm's `tree_logits`: the head's tree (tokens, scores, distributions)
    full: KVBuffers  # the target's keys and values; may lag behind `ids` after tiers 1-2
    slim: KVBuffers | None  # the slim view's; lags when a round skipped it
    last: RoundResult | None = None  # what the latest round committed
    escalate_next: bool = False  # the slim tier already refused the root's position: the full model judges it


def _tree_from_name(tree) -> list:
    if isinstance(tree, str):
        if not hasattr(eagle_choices, tree):
            raise ValueError(f"eagle-llm has no tree {tree!r}; its trees: mc_sim_7b_63, ...")
        return getattr(eagle_choices, tree)
    return [list(c) for c in tree]


# ----------------------------------------------------------------------------- the upgrade
class TieredEagle(nn.Module):
    """An eagle-llm `EaModel` whose tree verification runs VIA-SD's tiers (a wrapper; nothing copied).

    Args:
        ea_model: the deployment's `EaModel` (stock `EaModel.from_pretrained`, or
            `viasd_adapters.third_party.eagle.load_ea_model` for Qwen2 and other transformers targets).
        routing: the slim verifier's routing mask (`RoutingMask`, or the path of its YAML);
            `RoutingMask.none()` makes u the target itself.
        policy: the tier policy; None switches tiers 1-2 off (stock EAGLE, token for token).
        max_unverified: most committed tokens the full target may lag behind (the root, fed next,
            not counted), as `TieredVerifier`'s: a draft whose commit would exceed it goes to the
            full model, and a round with no room at all skips the slim pass.
        rejudge: greedy decoding: an escalation judges the whole tree, the drafts tier 1 accepted
            included (free: one forward). False, and always when sampling: the drafts tier 1
            accepted are committed and the full model judges the tree grown after them.
        draft_vocabulary: the head grows its trees over these ids only (`DraftVocabulary`, a
            shipped name or a JSON file; FR-Spec): the target's LM head restricted to them scores
            the drafts, the target still verifies over the full vocabulary (lossless). None: the
            full LM head, as stock EAGLE.
    """

    def __init__(self, ea_model: EaModel, routing: RoutingMask | str | Path | None = None,
                 policy: TierPolicy | None = None, max_unverified: int = 16, rejudge: bool = True,
                 draft_vocabulary: DraftVocabulary | str | Path | None = None):
        super().__init__()
        if not isinstance(ea_model, EaModel):
            raise TypeError(f"TieredEagle wraps an eagle-llm EaModel, got {type(ea_model).__name__}")
        if policy is not None and routing is None:
            raise ValueError("a tier policy needs a slim verifier: pass routing (RoutingMask.none() for the target itself)")
        if max_unverified < 0:
            raise ValueError(f"max_unverified must be >= 0, got {max_unverified}")
        self.ea = ea_model
        self.policy = policy
        self.max_unverified = max_unverified
        self.rejudge = rejudge
        self.routing = None
        self.layers = None
        if policy is not None:
            if isinstance(routing, (str, Path)):
                routing = RoutingMask.from_yaml(named_config("routing", routing, "routing mask", ROUTING_FORMS))
            self.layers = layers_for(ea_model.base_model)
            self.routing = routing.bind(self.layers.num_layers)
        self.draft_head = None
        if draft_vocabulary is not None:
            if not isinstance(draft_vocabulary, DraftVocabulary):
                draft_vocabulary = DraftVocabulary.load(draft_vocabulary)
            base = ea_model.base_model
            target = getattr(base, "target", base)  # TransformersEagleBase wraps the transformers model
            self.draft_head = VocabularyDraftHead(target, draft_vocabulary)
        self.stats: dict[str, CallStats] = {}
        self._tree_key = None
        self._tree_buffers = None

    # eagle-llm's public surface, passed through
    @property
    def base_model(self):
        return self.ea.base_model

    @property
    def ea_layer(self):
        return self.ea.ea_layer

    @property
    def tokenizer(self):
        return self.ea.tokenizer

    def get_tokenizer(self):
        return self.ea.tokenizer

    @property
    def config(self):
        return self.ea.config

    # ------------------------------------------------------------------ stock-compatible API
    @torch.no_grad()
    def eagenerate(self, input_ids, temperature=0.0, top_p=0.0, top_k=0.0, max_new_tokens=512, max_length=2048,
                   tree_choices=eagle_choices.mc_sim_7b_63):
        """`EaModel.eagenerate`'s signature, stop rules and return value ([1, T + new] ids)."""
        sampling = None
        if temperature > 1e-5:
            sampling = SamplingConfig(temperature=temperature, top_p=top_p if 0 < top_p <= 1 else 1.0,
                                      top_k=int(top_k))
        input_len = input_ids.shape[1]
        eos = self.ea.tokenizer.eos_token_id
        budget = max(1, min(max_new_tokens + 1, max_length - input_len + 1))
        ids = input_ids
        with contextlib.closing(self._generate(input_ids, sampling, budget, tree_choices)) as states:
            for state in states:
                ids = state.ids
                if eos in ids[0, input_len:].tolist() or ids.shape[1] - input_len > max_new_tokens \
                        or ids.shape[1] > max_length:
                    break
        return ids

    # ------------------------------------------------------------------ project API
    @torch.no_grad()
    def rounds(self, input_ids: torch.Tensor, sampling: SamplingConfig | None, max_new_tokens: int,
               tree_choices="mc_sim_7b_63") -> Iterator[RoundResult]:
        """Round by round results for `input_ids` ([1, T]); the caller stops when it has enough.

        `max_new_tokens` sizes the KV buffers (the rounds themselves never stop). Sampling draws
        from the global torch and `random` generators, as eagle-llm does (`EagleDecoder` seeds
        them for the generation and restores them after).
        """
        with contextlib.closing(self._generate(input_ids, sampling, max_new_tokens, tree_choices)) as states:
            for state in states:
                yield state.last

    # ------------------------------------------------------------------ the loop
    def _tree_layout(self, tree_choices, device):
        key = tuple(tuple(c) for c in tree_choices)
        if key != self._tree_key:
            buffers = generate_tree_buffers(tree_choices, device=device)
            buffers["retrieve_indices_head"] = buffers["retrieve_indices"].to(self.ea.base_model.lm_head.weight.device)
            buffers["parents"] = _parents(buffers["retrieve_indices"], buffers["tree_indices"].numel())
            # the head grows this tree too (eagle-llm's head keeps mc_sim_7b_63's layout otherwise)
            buffers["head"] = head_tree_buffers(tree_choices, device=self.ea.ea_layer.embed_tokens.weight.device)
            self._tree_key, self._tree_buffers = key, buffers
        return self._tree_buffers

    def _generate(self, input_ids, sampling, max_new_tokens, tree_choices):
        tree_choices = _tree_from_name(tree_choices)
        B, T = input_ids.shape
        if B != 1:
            raise ValueError(f"EAGLE decodes one prompt at a time, got batch size {B}")
        base = self.ea.base_model
        device = base.lm_head.weight.device
        buffers = self._tree_layout(tree_choices, device)
        N, D = buffers["tree_indices"].numel(), buffers["retrieve_indices"].shape[1] - 1
        logits_processor = None
        if sampling is not None and not sampling.greedy:
            logits_processor = prepare_logits_processor(temperature=sampling.temperature, top_p=sampling.top_p,
                                                        top_k=sampling.top_k)
        sampler = Sampler(sampling or SamplingConfig(), device)
        config = base.config
        L = int(config.num_hidden_layers)
        max_length = T + max_new_tokens + self.max_unverified + 2 * (N + D + 1)
        dtype = base.lm_head.weight.dtype
        self.stats = {"target": CallStats(), "eagle_head": CallStats()}
        g_full = KVBuffers(config, range(L), max_length, dtype, device)
        g_slim = None
        if self.policy is not None:
            self.stats["slim"] = CallStats()
            attending = [i for i in range(L) if self.routing.runs_attention(i)]
            g_slim = KVBuffers(config, attending, max_length, dtype, device)

        with tree_growth(self.ea.ea_layer, tree_choices, buffers["head"], self.draft_head):
            # 0. prefill: the target reads the prompt, picks the root, the head grows the first tree
            self.ea.ea_layer.reset_kv()
            reset_tree_mode(self.ea)
            begin = time.perf_counter()
            head_out, _, _, root = initialize_tree(input_ids, self.ea, buffers["tree_attn_mask"], g_full.caches,
                                                   logits_processor)
            self.stats["target"].add(T, time.perf_counter() - begin)
            g = _Generation(input_ids.clone(), root.reshape(1, 1).to(input_ids.device), head_out, g_full, g_slim)
            g.last = RoundResult([int(g.root)], 0, 0, {Tier.ESCALATE: 1})
            yield g
            while True:
                g.last = self._round(g, buffers, sampler, logits_processor)
                yield g

    def _round(self, g: _Generation, buffers, sampler: Sampler, logits_processor) -> RoundResult:
        # 1. draft: the head's tree
        candidates, cart_probs, tree_candidates = generate_candidates(
            g.head_out, buffers["tree_indices"], buffers["retrieve_indices"], g.root, logits_processor)
        tree = DraftTree(tree_candidates[0], buffers["retrieve_indices"], candidates, buffers["parents"])
        room = self.max_unverified - (g.ids.shape[1] - g.full.length)  # the full model lags by the difference
        # 2. slim verify over the tree; `decide` on the path it follows
        slim_ran = False
        if self.policy is not None and room > 0 and not g.escalate_next:
            u_logits, u_hidden = self._slim_pass(g, tree_candidates, buffers)
            slim_ran = True
            chosen = decide_tree(self.policy, tree, u_logits, sampler, room)
            decision = chosen.decision
            if decision.tier != Tier.ESCALATE:
                return self._commit_slim(g, tree, chosen, u_hidden, logits_processor)
            if decision.num_accepted and (not self.rejudge or not sampler.config.greedy):
                g.escalate_next = True  # the full model judges the position after the kept drafts
                return self._commit_slim(g, tree, chosen, u_hidden, logits_processor)
        # 3. escalate: the full target judges the tree with eagle-llm's own rule
        g.escalate_next = False
        return self._escalate(g, tree, cart_probs, tree_candidates, buffers, logits_processor, slim_ran)

    def _slim_pass(self, g: _Generation, tree_candidates, buffers):
        """u's logits [N, V] and normed hidden states [1, N, H] at the tree nodes (lagging tokens read first)."""
        S = g.ids.shape[1]
        start = g.slim.length
        ids = torch.cat([g.ids[:, start:], tree_candidates], dim=1)  # [1, lag + N]
        positions = torch.cat([torch.arange(start, S, device=ids.device),
                               buffers["tree_position_ids"].to(ids.device) + S])
        g.slim.room(ids.shape[1])
        begin = time.perf_counter()
        hidden = self.layers.forward(ids, positions, g.slim, buffers["tree_attn_mask"], self.routing)
        hidden = hidden[:, S - start:]  # [1, N, H]
        logits = self.layers.lm_head(hidden)[0]  # [N, V]
        self.stats["slim"].add(ids.shape[1], time.perf_counter() - begin)
        return logits, hidden

    def _commit_slim(self, g, tree, chosen: TreeDecision, u_hidden, logits_processor) -> RoundResult:
        """4. commit what the slim tier settled, no full model; the head reads the slim's features."""
        S = g.ids.shape[1]
        decision = chosen.decision
        a = decision.num_accepted
        nodes = tree.paths[chosen.path, : a + 1]  # root and the kept drafts
        drafts = tree.candidates[chosen.path, 1 : a + 1].tolist()
        if decision.token is not None:  # u's rewrite, or its token after the whole path
            next_token = decision.token
            tokens = drafts + [next_token]
        else:  # the last kept draft becomes the root: it is output, not yet read by any model
            next_token = drafts[-1]
            nodes = nodes[:-1]
            tokens = drafts
        counts = {Tier.ACCEPT: a} if a else {}
        if decision.token is not None:
            counts[Tier.SLIM] = 1
        g.slim.keep(S, nodes.to(g.slim.data.device) + S)
        committed = tree.nodes[nodes][None].to(g.ids.device)  # [1, c]
        g.ids = torch.cat([g.ids, committed], dim=1)
        g.root = g.ids.new_tensor([[next_token]])
        begin = time.perf_counter()
        g.head_out = self.ea.ea_layer.topK_genrate(
            u_hidden[:, nodes], input_ids=torch.cat([g.ids, g.root], dim=1), head=self.ea.base_model.lm_head,
            logits_processor=logits_processor)
        self.stats["eagle_head"].add(committed.shape[1], time.perf_counter() - begin)
        return RoundResult(tokens, a, tree.depth, counts)

    def _escalate(self, g, tree, cart_probs, tree_candidates, buffers, logits_processor, slim_ran) -> RoundResult:
        """3-4. the full target reads [lagging tokens + tree]; eagle-llm's posterior rule and commit."""
        S = g.ids.shape[1]
        start = g.full.length
        lag = S - start
        ids = torch.cat([g.ids[:, start:], tree_candidates], dim=1)  # [1, lag + N]
        positions = buffers["tree_position_ids"] + S
        if lag:
            positions = torch.cat([torch.arange(start, S, device=positions.device), positions])
        g.full.room(ids.shape[1])
        begin = time.perf_counter()
        _, orig, hidden = self.ea(ids, output_orig=True, past_key_values=g.full.caches, position_ids=positions,
                                  init=False)
        logits = orig[0, lag:][buffers["retrieve_indices_head"]]  # [P, D + 1, V]
        self.stats["target"].add(ids.shape[1], time.perf_counter() - begin)
        best, accept_length, sample_p = evaluate_posterior(
            logits, tree.candidates, logits_processor, cart_probs, g.head_out[2], buffers["p_indices"],
            tree_candidates, buffers["b_indices"])
        accept_length = int(accept_length)
        if lag:  # the head re-reads the lagging positions with the full model's features
            rewind_head(self.ea.ea_layer, start)
            next_tokens = torch.cat([g.ids[:, start + 1 :], g.root], dim=1)  # [1, lag]
            extend_head(self.ea.ea_layer, hidden[:, :lag], next_tokens)
            assert head_length(self.ea.ea_layer) == S
        if slim_ran:
            g.slim.keep(S, buffers["retrieve_indices"][best, : accept_length + 1].to(g.slim.data.device) + S)
        begin = time.perf_counter()
        g.ids, g.head_out, _, _, root = update_inference_inputs(
            g.ids, tree.candidates, best, accept_length, buffers["retrieve_indices"], logits_processor, logits,
            g.head_out, 0, [g.full.data], g.full.lengths, self.ea, None, hidden[:, lag:], sample_p)
        self.stats["eagle_head"].add(accept_length + 1, time.perf_counter() - begin)
        g.root = root.reshape(1, 1).to(g.ids.device)
        tokens = tree.candidates[best, 1 : accept_length + 1].tolist() + [int(g.root)]
        return RoundResult(tokens, accept_length, tree.depth, {Tier.ESCALATE: accept_length + 1})


@contextlib.contextmanager
def _global_rng(sampling: SamplingConfig):
    """eagle-llm samples from the global torch and `random` generators: seed them, then restore them."""
    state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sampling.seed)
        random.seed(sampling.seed)
        try:
            yield
        finally:
            random.setstate(state)


# ----------------------------------------------------------------------------- the Decoder
def resolve_head(head: str | Path) -> Path:
    """A head folder as given, or the name of a head shipped with the package (`third_party/eagle/heads/`)."""
    path = Path(head).expanduser()
    for candidate in (path, SHIPPED_HEADS / path):
        if is_head_folder(candidate):
            return candidate
    raise ValueError(
        f"no EAGLE head at {head} (config.json with head.safetensors or pytorch_model.bin), nor shipped under"
        f" that name: train one with `viasd-train-eagle model_pair=...` (it writes outputs/eagle/<target>/) and"
        " pass that folder as framework.decoder.head=FOLDER (docs/eagle.md)"
    )


def tree_tiers(verifier: Verifier, target: PreTrainedModel | None = None):
    """(routing, policy, max_unverified, rejudge) of the tree path from a configured verifier.

    Which verifiers EAGLE runs is the compatibility table's to say (`viasd_adapters.compat`).
    """
    check("eagle", *built_kind(verifier), framework="framework=eagle")
    if isinstance(verifier, TieredVerifier):
        if target is not None and verifier.target.model is not target:
            raise ValueError("the tiered verifier was built for another target than EAGLE's")
        if verifier.policy is None:  # tiers off: stock EAGLE
            return None, None, verifier.max_unverified, verifier.rejudge
        return verifier.slim.model.mask, verifier.policy, verifier.max_unverified, verifier.rejudge
    return None, None, 16, True


class EagleDecoder(Decoder):
    """EAGLE (optionally tiered) behind the project's `Decoder` interface, with `DecodeStats`.

    Built either around a transformers target already loaded (`target=` and `head=`: the pipeline's
    way; the target is shared, not reloaded) or around an existing `EaModel` (`ea_model=`).

    The tiers come from `verifier=` (what the `verifier` config group builds, as for every other
    host: `LosslessVerifier` is stock EAGLE, `TieredVerifier` gives its policy, routing mask,
    `max_unverified` and `rejudge` to the tree path) or, from Python, from `routing=` and `policy=`.
    `vocabulary` restricts what the head's tree growth scores (`TieredEagle`'s `draft_vocabulary`).

    `stats.drafted` counts D per round (the most a round can accept), `stats.steps` the rounds
    (the prefill, which yields the first token, is not one); `model_calls` has "target", "slim" and
    "eagle_head" (the head's tree growth, eagle-llm's `topK_genrate`, inside the commit).
    """

    def __init__(self, target: PreTrainedModel | None = None, head: str | Path | None = None,
                 ea_model: EaModel | None = None, verifier: Verifier | None = None,
                 routing: RoutingMask | str | Path | None = None, policy: TierPolicy | None = None,
                 max_unverified: int = 16, rejudge: bool = True, tree: str | list = "mc_sim_7b_63",
                 tokenizer_path: str | Path | None = None, vocabulary: DraftVocabulary | str | Path | None = None):
        if ea_model is None and (target is None or head is None):
            raise ValueError("EagleDecoder needs ea_model=, or target= and head= (an EAGLE head folder)")
        if verifier is not None:
            if routing is not None or policy is not None:
                raise ValueError("give the tiers either as verifier= or as routing= and policy=, not both")
            routing, policy, max_unverified, rejudge = tree_tiers(verifier, target)
        self.tree = _tree_from_name(tree)
        if ea_model is None:
            ea_model = ea_model_from_target(target, resolve_head(head), tokenizer_path)
        self.model = TieredEagle(ea_model, routing, policy, max_unverified, rejudge, draft_vocabulary=vocabulary)

    @property
    def context_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=()):
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, tokens], got shape {tuple(input_ids.shape)}")
        T = input_ids.shape[1]
        if T == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if T + max_new_tokens > self.context_length:
            raise ValueError(
                f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds the context window ({self.context_length})")
        stops = set(stop_token_ids)
        stats = DecodeStats()
        tokens: list[int] = []
        sampled = sampling is not None and not sampling.greedy
        begin = time.perf_counter()
        rounds = contextlib.closing(self.model.rounds(input_ids, sampling, max_new_tokens, self.tree))
        with _global_rng(sampling) if sampled else contextlib.nullcontext(), rounds as results:
            for result in results:
                if result.num_drafted:
                    stats.steps += 1
                    stats.drafted += result.num_drafted
                    stats.accepted += result.num_accepted
                stats.tier_counts.update(result.tier_counts)
                done = False
                for token in result.tokens:
                    tokens.append(token)
                    if token in stops or len(tokens) >= max_new_tokens:
                        done = True
                        break
                if done:
                    break
        stats.seconds = time.perf_counter() - begin
        stats.new_tokens = len(tokens)
        stats.model_calls = dict(self.model.stats)
        return GenerationResult(tokens, stats)
