"""VIA-SD for EAGLE: eagle-llm 1.2.1's draft tree, judged by the project's verifiers.

An existing eagle-llm deployment keeps its `EaModel` (target + draft head) and wraps it:

    model = EaModel.from_pretrained(base_model_path=..., ea_model_path=...)   # as before
    model = TieredEagle(model, routing=mask, policy=ConfidencePolicy())       # the upgrade
    output_ids = model.eagenerate(input_ids, temperature=0.0, max_new_tokens=256)

eagle-llm stays the host: its head grows the tree, its target forward, `evaluate_posterior` and
`update_inference_inputs` are the full model's lossless judge of the tree. The verify step is the
project's: each round hands the tree to a `Verifier` (`TieredVerifier` for VIA-SD, `LosslessVerifier`
for stock EAGLE), which runs the tiers as for a chain of drafts (verify/tiered.py):

1. draft: the head's tree of N nodes (eagle-llm's `generate_candidates`); node 0 is the root, the
   token after the committed sequence, the others are the `DraftTree`'s drafts;
2. verify: `verifier.verify_tree(committed + root, tree, sampler, judge)`; the slim tier settles
   what it may, and `EagleJudge` (eagle-llm's forward over [lagging tokens + tree], its
   `evaluate_posterior` and `update_inference_inputs`) judges the rest;
3. commit: after the full model, eagle-llm's own commit (KV compaction, the head's next tree);
   after the slim tier, the head reads u's features of the committed tokens and grows the next
   tree (they are replaced by the full model's once it catches up).

With `policy=None` each round is exactly stock `eagenerate`'s: the output is token-identical to
it (greedy, and sampling under the same global seeds).

Terms: N tree nodes, P paths, D = max drafts on a path (`mc_sim_7b_63`: N 26, P 15, D 5), V vocab.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from ..compat import built_kind, check
from ..decode import CommittedSequence, Decoder, DecodeStats, GenerationResult, RankAcceptance
from ..models.compiled import KV_GROWTH, decode_step
from ..models.quantize import CALIBRATION_TEXT, Int8Linear, input_outliers, quantize_module
from ..models.vocab import DraftVocabulary, VocabularyDraftHead
from ..routing import RoutingMask
from ..runner import CallStats
from ..sampling import Sampler, SamplingConfig
from ..verify import LosslessVerifier, Tier, TieredVerifier, TierPolicy, Verdict, Verifier
from ..verify.arguments import routing_mask, verifier_for
from ..verify.tree import DraftTree, TreeAcceptance, TreeJudge, TreeVerdict

try:
    from eagle.model import choices as eagle_choices
    from eagle.model.ea_model import EaModel
    from eagle.model.utils import (
        evaluate_posterior,
        generate_candidates,
        generate_tree_buffers,
        initialize_tree,
        prepare_logits_processor,
        reset_tree_mode,
        update_inference_inputs,
    )
    from eagle.model.utils_c import generate_tree_buffers as head_tree_buffers

    from ..third_party import eagle as third_party_eagle
    from ..third_party.eagle import (
        KVBuffers,
        TransformersEagleBase,
        ea_model_from_target,
        extend_head,
        head_length,
        is_head_folder,
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


# ----------------------------------------------------------------------------- eagle-llm's tree, as the verifier takes it
def _parents(paths: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[N] long parent of each node of a tree given by its root-to-leaf `paths` ([P, D + 1], -1 pads)."""
    parent = [-1] * num_nodes
    for path in paths.tolist():
        for prev, node in zip(path, path[1:]):
            if node < 0:
                break
            parent[node] = prev
    return torch.tensor(parent, dtype=torch.long, device=paths.device)


def draft_tree(tree_candidates: torch.Tensor, parents: torch.Tensor) -> DraftTree:
    """The `DraftTree` of eagle-llm's tree: its nodes [1, N] (node 0 the root) and their parents [N].

    Draft n is node n + 1. Its p is one-hot: greedy, the head's top-k is deterministic; sampling,
    u's speculative-sampling test of a one-hot p is exact for drafts drawn in any way (`decide`).
    """
    return DraftTree(tree_candidates[0, 1:], parents[1:] - 1)


@dataclass
class _Generation:
    """The state of one generation between rounds."""

    ids: torch.Tensor  # [1, T'] committed sequence (prompt + output), without the root
    root: torch.Tensor  # [1, 1] the next token: output already, not yet fed to any model
    head_out: tuple  # eagle-llm's `tree_logits`: the head's tree (tokens, scores, distributions)
    full: KVBuffers  # the target's keys and values; may lag behind `ids` after tiers 1-2
    last: Verdict | None = None  # what the latest round committed

    @property
    def committed(self) -> torch.Tensor:
        """[1, T' + 1] everything committed: the sequence and the root."""
        return torch.cat([self.ids, self.root], dim=1)


class EagleJudge(TreeJudge):
    """The full target's side of one EAGLE round, all eagle-llm's: its target forward over
    [lagging tokens + tree] into its KV buffers, `evaluate_posterior` (greedy match or EAGLE's tree
    rejection sampling) and `update_inference_inputs` (compaction, the head's next tree)."""

    def __init__(
        self,
        owner: TieredEagle,
        g: _Generation,
        buffers: dict,
        candidates,
        cart_probs,
        tree_candidates,
        logits_processor,
    ):
        self.owner, self.g, self.buffers = owner, g, buffers
        self.candidates = candidates  # [P, D + 1] the tokens along each path; -1 pads
        self.cart_probs = cart_probs  # [P, D + 1] the head's probabilities along each path (sampling)
        self.tree_candidates = tree_candidates  # [1, N] the nodes
        self.logits_processor = logits_processor

    @property
    def cached_length(self) -> int:
        return self.g.full.length

    def judge(self, input_ids, tree, sampler) -> TreeAcceptance:
        g, buffers, ea, stats = self.g, self.buffers, self.owner.ea, self.owner.stats
        S = g.ids.shape[1]
        assert input_ids.shape[1] == S + 1, "the round's tree hangs below the root"
        start = g.full.length
        lag = S - start
        ids = torch.cat([g.ids[:, start:], self.tree_candidates], dim=1)  # [1, lag + N]
        positions = buffers["tree_position_ids"] + S
        if lag:
            positions = torch.cat([torch.arange(start, S, device=positions.device), positions])
        g.full.room(ids.shape[1])
        begin = time.perf_counter()
        _, orig, hidden = ea(ids, output_orig=True, past_key_values=g.full.caches, position_ids=positions, init=False)
        logits = orig[0, lag:][buffers["retrieve_indices_head"]]  # [P, D + 1, V]
        stats["target"].add(ids.shape[1], time.perf_counter() - begin)
        best, accept_length, sample_p = evaluate_posterior(
            logits,
            self.candidates,
            self.logits_processor,
            self.cart_probs,
            g.head_out[2],
            buffers["p_indices"],
            self.tree_candidates,
            buffers["b_indices"],
        )
        accept_length = int(accept_length)
        if lag:  # the head re-reads the lagging positions with the full model's features
            rewind_head(ea.ea_layer, start)
            next_tokens = torch.cat([g.ids[:, start + 1 :], g.root], dim=1)  # [1, lag]
            extend_head(ea.ea_layer, hidden[:, :lag], next_tokens)
            assert head_length(ea.ea_layer) == S
        begin = time.perf_counter()
        g.ids, g.head_out, _, _, root = update_inference_inputs(
            g.ids,
            self.candidates,
            best,
            accept_length,
            buffers["retrieve_indices"],
            self.logits_processor,
            logits,
            g.head_out,
            0,
            g.full.tensors,
            g.full.lengths,
            ea,
            None,
            hidden[:, lag:],
            sample_p,
        )
        stats["eagle_head"].add(accept_length + 1, time.perf_counter() - begin)
        g.root = root.reshape(1, 1).to(g.ids.device)
        path = buffers["retrieve_indices"][best, 1 : accept_length + 1] - 1  # node n is draft n - 1
        return TreeAcceptance(path.to(tree.tokens.device), int(g.root))


def _head_growth_buffers(tree_choices: list, device) -> dict:
    """eagle-llm's buffers for the head's growth of a tree, one list entry per level below the
    first; a one-level tree (what a profile with dear head steps picks) has none, which eagle-llm's
    builder cannot express (it indexes the empty lists), and its growth loop then runs no level."""
    if max(len(c) for c in tree_choices) == 1:
        return {"attn_mask": [], "tree_indices": [], "position_ids": [], "repeat_nums": []}
    return head_tree_buffers(tree_choices, device=device)


def _tree_from_name(tree) -> list:
    if isinstance(tree, str):
        if not hasattr(eagle_choices, tree):
            raise ValueError(f"eagle-llm has no tree {tree!r}; its trees: mc_sim_7b_63, ...")
        return getattr(eagle_choices, tree)
    return [list(c) for c in tree]


# ----------------------------------------------------------------------------- the upgrade
def tiers_verifier(
    ea_model: EaModel,
    routing: RoutingMask | str | Path | None,
    policy: TierPolicy | None,
    max_unverified: int = 16,
    rejudge: bool = True,
) -> Verifier:
    """The verifier of `TieredEagle`'s Python arguments: `LosslessVerifier` (stock EAGLE) without a
    policy, else a `TieredVerifier` whose slim verifier is the target routed by `routing`."""
    if policy is not None and routing is None:
        raise ValueError("a tier policy needs a slim verifier: pass routing (RoutingMask.none() for the target itself)")
    base = ea_model.base_model
    target = base.target if isinstance(base, TransformersEagleBase) else base
    if policy is None:
        return LosslessVerifier(target)
    if not isinstance(base, TransformersEagleBase):
        raise ValueError(
            f"the slim tier runs the target's transformers layers; this EaModel's base is eagle-llm's own"
            f" {type(base).__name__}: load it with viasd_adapters.third_party.eagle.load_ea_model(...,"
            " backend='transformers') for the tiers"
        )
    return verifier_for(target, routing_mask(routing), policy, max_unverified, rejudge)


class TieredEagle(nn.Module):
    """An eagle-llm `EaModel` whose tree is judged by a project `Verifier` (a wrapper; nothing copied).

    Args:
        ea_model: the deployment's `EaModel` (stock `EaModel.from_pretrained`, or
            `viasd_adapters.third_party.eagle.load_ea_model` for Qwen2 and other transformers targets).
        routing, policy, max_unverified, rejudge: VIA-SD's tiers, `TieredVerifier`'s settings
            (`routing`: a `RoutingMask` or the path of its YAML, `RoutingMask.none()` makes u the
            target itself; `policy=None`: stock EAGLE, token for token).
        verifier: the verifier itself instead (`LosslessVerifier` or `TieredVerifier` of the target).
        draft_vocabulary: the head grows its trees over these ids only (`DraftVocabulary`, a
            shipped name or a JSON file; FR-Spec): the target's LM head restricted to them scores
            the drafts, the target still verifies over the full vocabulary (lossless). None: the
            full LM head, as stock EAGLE.
    """

    def __init__(
        self,
        ea_model: EaModel,
        routing: RoutingMask | str | Path | None = None,
        policy: TierPolicy | None = None,
        max_unverified: int = 16,
        rejudge: bool = True,
        draft_vocabulary: DraftVocabulary | str | Path | None = None,
        verifier: Verifier | None = None,
    ):
        super().__init__()
        if not isinstance(ea_model, EaModel):
            raise TypeError(f"TieredEagle wraps an eagle-llm EaModel, got {type(ea_model).__name__}")
        if verifier is not None and (routing is not None or policy is not None):
            raise ValueError("give the tiers either as verifier= or as routing= and policy=, not both")
        self.ea = ea_model
        self.verifier = verifier or tiers_verifier(ea_model, routing, policy, max_unverified, rejudge)
        self.draft_head = None
        if draft_vocabulary is not None:
            if not isinstance(draft_vocabulary, DraftVocabulary):
                draft_vocabulary = DraftVocabulary.load(draft_vocabulary)
            base = ea_model.base_model
            target = getattr(base, "target", base)  # TransformersEagleBase wraps the transformers model
            self.draft_head = VocabularyDraftHead(target, draft_vocabulary)
        self._stats: dict[str, CallStats] = {}
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

    @property
    def stats(self) -> dict[str, CallStats]:
        """Cost per model of the latest generation: "target" and "eagle_head" (eagle-llm's), and
        the verifier's own models but its unused chain-path target (the slim view: "slim")."""
        own = {name: c for name, c in self.verifier.stats.items() if name != "target"}
        return {**self._stats, **own}

    # ------------------------------------------------------------------ stock-compatible API
    @torch.no_grad()
    def eagenerate(
        self,
        input_ids,
        temperature=0.0,
        top_p=0.0,
        top_k=0.0,
        max_new_tokens=512,
        max_length=2048,
        tree_choices=eagle_choices.mc_sim_7b_63,
    ):
        """`EaModel.eagenerate`'s signature, stop rules and return value ([1, T + new] ids)."""
        sampling = None
        if temperature > 1e-5:
            sampling = SamplingConfig(temperature=temperature, top_p=top_p if 0 < top_p <= 1 else 1.0, top_k=int(top_k))
        input_len = input_ids.shape[1]
        eos = self.ea.tokenizer.eos_token_id
        budget = max(1, min(max_new_tokens + 1, max_length - input_len + 1))
        ids = input_ids
        with contextlib.closing(self._generate(input_ids, sampling, budget, tree_choices)) as states:
            for state in states:
                ids = state.ids
                if (
                    eos in ids[0, input_len:].tolist()
                    or ids.shape[1] - input_len > max_new_tokens
                    or ids.shape[1] > max_length
                ):
                    break
        return ids

    # ------------------------------------------------------------------ project API
    @torch.no_grad()
    def rounds(
        self, input_ids: torch.Tensor, sampling: SamplingConfig | None, max_new_tokens: int, tree_choices="mc_sim_7b_63"
    ) -> Iterator[Verdict]:
        """Round by round verdicts for `input_ids` ([1, T]); the caller stops when it has enough.

        The prefill is round 0: one token, nothing drafted. `max_new_tokens` sizes the KV buffers
        (the rounds themselves never stop). Sampling draws from the global torch and `random`
        generators, as eagle-llm does (`EagleDecoder` seeds them for the generation and restores them after).
        """
        with contextlib.closing(self._generate(input_ids, sampling, max_new_tokens, tree_choices)) as states:
            for state in states:
                yield state.last

    # ------------------------------------------------------------------ the loop
    def _tree_layout(self, tree_choices, device):
        key = tuple(tuple(c) for c in tree_choices)
        if key != self._tree_key:
            buffers = generate_tree_buffers(tree_choices, device=device)
            buffers["retrieve_indices_head"] = buffers["retrieve_indices"].to(self.ea.base_model.device)
            buffers["parents"] = _parents(buffers["retrieve_indices"], buffers["tree_indices"].numel())
            # the head grows this tree too (eagle-llm's head keeps mc_sim_7b_63's layout otherwise)
            buffers["head"] = _head_growth_buffers(tree_choices, self.ea.ea_layer.embed_tokens.weight.device)
            self._tree_key, self._tree_buffers = key, buffers
        return self._tree_buffers

    def _generate(self, input_ids, sampling, max_new_tokens, tree_choices):
        tree_choices = _tree_from_name(tree_choices)
        B, T = input_ids.shape
        if B != 1:
            raise ValueError(f"EAGLE decodes one prompt at a time, got batch size {B}")
        base = self.ea.base_model
        device = base.device
        buffers = self._tree_layout(tree_choices, device)
        N, D = buffers["tree_indices"].numel(), buffers["retrieve_indices"].shape[1] - 1
        logits_processor = None
        if sampling is not None and not sampling.greedy:
            logits_processor = prepare_logits_processor(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k
            )
        sampler = Sampler(sampling or SamplingConfig(), device)
        config = base.config
        lag = getattr(self.verifier, "max_unverified", 0)  # the most the full model can fall behind
        # Whole KV_GROWTH blocks, as the compiled step's own caches: each buffer length is a graph
        # of the compiled step, and a length per prompt recompiled it on every generation.
        needed = T + max_new_tokens + lag + 2 * (N + D + 1)
        max_length = math.ceil(needed / KV_GROWTH) * KV_GROWTH
        self._stats = {"target": CallStats(), "eagle_head": CallStats()}
        self.verifier.reset()
        g_full = KVBuffers(config, range(int(config.num_hidden_layers)), max_length, base.dtype, device)

        with tree_growth(self.ea.ea_layer, tree_choices, buffers["head"], self.draft_head):
            # 0. prefill: the target reads the prompt, picks the root, the head grows the first tree
            self.ea.ea_layer.reset_kv()
            reset_tree_mode(self.ea)
            begin = time.perf_counter()
            head_out, _, _, root = initialize_tree(
                input_ids, self.ea, buffers["tree_attn_mask"], g_full.caches, logits_processor
            )
            self._stats["target"].add(T, time.perf_counter() - begin)
            g = _Generation(input_ids.clone(), root.reshape(1, 1).to(input_ids.device), head_out, g_full)
            g.last = Verdict(g.root[0], 0, 0, {Tier.ESCALATE: 1})
            yield g
            while True:
                g.last = self._round(g, buffers, sampler, logits_processor)
                yield g

    def _round(self, g: _Generation, buffers, sampler: Sampler, logits_processor) -> TreeVerdict:
        # 1. draft: the head's tree
        candidates, cart_probs, tree_candidates = generate_candidates(
            g.head_out, buffers["tree_indices"], buffers["retrieve_indices"], g.root, logits_processor
        )
        tree = draft_tree(tree_candidates, buffers["parents"])
        judge = EagleJudge(self, g, buffers, candidates, cart_probs, tree_candidates, logits_processor)
        # 2. verify: the verifier's tiers, the judge (eagle-llm's) where the full model decides
        verdict = self.verifier.verify_tree(g.committed, tree, sampler, judge)
        # 3. commit: the judge committed what the full model decided; the slim tier's commit is ours
        if verdict.features is not None:
            self._commit_slim(g, verdict, logits_processor)
        return verdict

    def _commit_slim(self, g: _Generation, verdict: TreeVerdict, logits_processor) -> None:
        """What the slim tier settled joins the sequence, no full model; the head reads u's features.

        The last committed token becomes the root (output, not yet read by any model); the ones
        before it, the old root first, are read by the head with u's features at them.
        """
        tokens = verdict.tokens[None].to(g.ids.device)  # [1, c]
        g.ids = torch.cat([g.ids, g.root, tokens[:, :-1]], dim=1)
        g.root = tokens[:, -1:]
        begin = time.perf_counter()
        g.head_out = self.ea.ea_layer.topK_genrate(
            verdict.features[:, : tokens.shape[1]],
            input_ids=g.committed,
            head=self.ea.base_model.lm_head,
            logits_processor=logits_processor,
        )
        self._stats["eagle_head"].add(tokens.shape[1], time.perf_counter() - begin)


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
        " pass that folder as framework.decoder.head=FOLDER (docs/results/eagle.md)"
    )


HEAD_PRECISIONS = (None, "int8", "as-loaded")


def quantize_head(ea_model: EaModel) -> None:
    """The head's linear layers in the int8 target's W8A8 (`Int8Linear`: the same kernels), in
    place. Input channels of other scales get groups of their own, each row quantised per group:
    fc's token embedding (a few hundredths) beside the target's feature (units, some channels
    hundreds), and the outlier channels of the feature and of down_proj's input, found on the
    target's features of `CALIBRATION_TEXT`."""
    head, base = ea_model.ea_layer, ea_model.base_model
    if any(isinstance(m, Int8Linear) for m in head.modules()):
        return
    ids = ea_model.tokenizer(CALIBRATION_TEXT, return_tensors="pt").input_ids.to(base.device)

    def run() -> None:
        features = base.target(ids, output_hidden_states=True).hidden_states[-1]  # [1, T, H], normed
        head(features[:, :-1].to(head.fc.weight.dtype), input_ids=ids[:, 1:])

    with torch.no_grad():
        outliers: dict = input_outliers(head, run, ("fc", "down_proj"))
    H = head.embed_tokens.embedding_dim
    outliers["fc"] = [torch.arange(H), outliers["fc"][outliers["fc"] >= H]]  # fc's input: cat(embedding, feature)
    quantize_module(head, "int8", skip=(head.embed_tokens,), outliers=outliers)


def head_acceptance(folder: str | Path) -> RankAcceptance | None:
    """The acceptance by depth and rank the head in `folder` was measured at when trained (its
    recipe.json's, which `viasd-train-eagle` writes); None when it has none."""
    recipe = Path(folder) / "recipe.json"
    measured = json.loads(recipe.read_text()).get("rank_acceptance") if recipe.is_file() else None
    return RankAcceptance.from_dict(measured) if measured else None


class EagleDecoder(Decoder):
    """EAGLE (optionally tiered) behind the project's `Decoder` interface, with `DecodeStats`.

    Built either around a transformers target already loaded (`target=` and `head=`: the pipeline's
    way; the target is shared, not reloaded) or around an existing `EaModel` (`ea_model=`).

    The tree is judged by `verifier=` (what the `verifier` config group builds, as for every other
    host: `LosslessVerifier` is stock EAGLE, `TieredVerifier` VIA-SD, the same object SD runs) or,
    from Python, by the one `routing=` and `policy=` give (`tiers_verifier`). Which verifiers
    EAGLE runs is the compatibility table's to say (`viasd_adapters.compat`). `vocabulary`
    restricts what the head's tree growth scores (`TieredEagle`'s `draft_vocabulary`).
    `tokenizer`: the target's tokenizer, for a target not loaded from a folder (EaModel reads one).
    `head_precision`: "int8" runs the head's layers in the int8 target's kernels (`quantize_head`),
    "as-loaded" keeps them in the dtype they loaded in; None, the default: int8 on an int8 target.

    `stats.drafted` counts D per round (the most a round can accept), `stats.steps` the rounds
    (the prefill, which yields the first token, is not one), `stats.settled` the rounds the full
    model chose no token of; `model_calls` has "target", "slim" and "eagle_head" (the head's tree
    growth, eagle-llm's `topK_genrate`, inside the commit).
    """

    def __init__(
        self,
        target: PreTrainedModel | None = None,
        head: str | Path | None = None,
        ea_model: EaModel | None = None,
        verifier: Verifier | None = None,
        routing: RoutingMask | str | Path | None = None,
        policy: TierPolicy | None = None,
        max_unverified: int = 16,
        rejudge: bool = True,
        tree: str | list = "mc_sim_7b_63",
        tokenizer_path: str | Path | None = None,
        vocabulary: DraftVocabulary | str | Path | None = None,
        head_precision: str | None = None,
        tokenizer=None,
    ):
        if head_precision not in HEAD_PRECISIONS:
            raise ValueError(
                f"head_precision={head_precision!r} is not one of {HEAD_PRECISIONS}"
                " (null: int8 on an int8 target, else as loaded)"
            )
        if ea_model is None and (target is None or head is None):
            raise ValueError("EagleDecoder needs ea_model=, or target= and head= (an EAGLE head folder)")
        if verifier is not None:  # before the head loads
            check("eagle", *built_kind(verifier), framework="framework=eagle", verifier=type(verifier))
            if isinstance(verifier, TieredVerifier) and target is not None and verifier.target.model is not target:
                raise ValueError("the tiered verifier was built for another target than EAGLE's (its slim view)")
        self.tree = _tree_from_name(tree)
        if ea_model is None:
            ea_model = ea_model_from_target(
                target, resolve_head(head), tokenizer_path, step=decode_step(target), tokenizer=tokenizer
            )
        if head_precision == "int8" or (head_precision is None and isinstance(ea_model.base_model.lm_head, Int8Linear)):
            quantize_head(ea_model)
        if verifier is None:
            verifier = tiers_verifier(ea_model, routing, policy, max_unverified, rejudge)
        elif routing is not None or policy is not None:
            raise ValueError("give the tiers either as verifier= or as routing= and policy=, not both")
        self.model = TieredEagle(ea_model, draft_vocabulary=vocabulary, verifier=verifier)

    @property
    def verifier(self) -> Verifier:
        return self.model.verifier

    @property
    def context_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=(), streamer=None):
        committed = CommittedSequence(input_ids, max_new_tokens, stop_token_ids, self.context_length, streamer)
        ranks = RankAcceptance()
        stats = DecodeStats(tree_ranks=ranks)
        choices = sorted((tuple(c) for c in self.tree), key=lambda c: (len(c), c))  # draft n: eagle-llm's node n + 1
        sampled = sampling is not None and not sampling.greedy
        begin = time.perf_counter()
        rounds = contextlib.closing(self.model.rounds(input_ids, sampling, committed.max_new_tokens, self.tree))
        with _global_rng(sampling) if sampled else contextlib.nullcontext(), rounds as verdicts:
            for verdict in verdicts:
                if verdict.num_drafted:
                    stats.add_round(
                        verdict.num_drafted,
                        verdict.num_accepted,
                        verdict.tier_counts,
                        settled=verdict.last_tier != Tier.ESCALATE,
                    )
                    ranks.add_round(choices, choices[int(verdict.path[-1])] if verdict.path.numel() else ())
                else:  # the prefill's token: counted by tier, not a round
                    stats.tier_counts.update(verdict.tier_counts)
                committed.commit(verdict.tokens)
                if committed.done:
                    break
        stats.seconds = time.perf_counter() - begin
        stats.new_tokens = len(committed.new_tokens)
        stats.model_calls = dict(self.model.stats)
        return GenerationResult(committed.new_tokens, stats)
