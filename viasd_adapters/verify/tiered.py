"""VIA-SD's three-tier verifier: accept, slim rewrite, or escalate to the full target."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..draft.base import DraftBlock
from ..routing.shared_prefix import SharedPrefixRunner
from ..routing.slim import SlimModel, compile_view
from ..runner import CallStats, CausalLMRunner, common_prefix_length
from ..sampling import Sampler
from .acceptance import lossless_accept
from .base import Verdict, Verifier
from .decision import SlimScores, decide
from .gate import BlockGate
from .policy import Tier, TierPolicy
from .tree import DraftTree, TreeJudge, TreeVerdict, decide_tree, judged, keep_path, score_tree

SlimFactory = Callable[[PreTrainedModel], PreTrainedModel | SlimModel]


class TieredVerifier(Verifier):
    """Composes a slim verifier u and the full target q behind the `Verifier` interface.

    Per block: one slim forward scores all K draft tokens, then `decide` (verify/decision.py, the
    rule the EAGLE tree path shares) settles what the slim tier may:
      1. ACCEPT tokens are kept without the full model (after a block kept whole, u's own next
         token too when it is confident);
      2. SLIM: u's token replaces the draft token and the block ends;
      3. ESCALATE: one full forward catches up on every token committed without it (its
         cache lags) together with the block, then the lossless rule judges the block.
    Greedy, the policy's thresholds pick the tiers; sampling, u judges the positions the policy
    lets it settle with speculative sampling, so those tokens follow u exactly and the rest q.
    With `policy=None` no slim forward runs and this is exactly `LosslessVerifier`.

    A draft tree (`verify_tree`, EAGLE's) goes the same way: one slim forward over the tree, `decide`
    on the path u follows, the tree's lossless judge (the host's) on escalation.

    With `share_prefix` and a routed slim view, the decoder layers [0, p) the two share run once,
    in the slim forward, and an escalation runs only the target's layers [p, L) and LM head over
    the stored layer-p states (`SharedPrefixRunner`): (L - p) / L of a full forward's layer work.
    """

    @staticmethod
    def check_settings(max_unverified: int = 16, **_) -> None:
        """The plain settings' rules (also checked before any model loads: `viasd_adapters.checks`)."""
        if max_unverified < 0:
            raise ValueError(f"max_unverified must be >= 0, got {max_unverified}")

    def __init__(
        self,
        target: PreTrainedModel,
        slim: PreTrainedModel | SlimModel | SlimFactory | None = None,
        policy: TierPolicy | None = None,
        max_unverified: int = 16,
        rejudge: bool = True,
        share_prefix: bool = False,
        gate: BlockGate | None = None,
    ):
        """
        Args:
            target: the full model q.
            slim: the slim verifier u (a transformers causal LM, or a `SlimModel` view of the
                target), or a callable that builds it from the target (a routed view, usually).
            policy: assigns tiers; None switches tiers 1-2 off.
            max_unverified: most committed tokens the full model may lag behind (the last
                committed token, which is fed next, not counted); a position that would exceed
                it goes to the full model, which bounds drift. 0 switches tiers 1-2 off.
            rejudge: greedy decoding: when the full model runs, it also judges the tokens tier 1
                accepted earlier in the same block (free: they are in its forward anyway).
                Sampling never re-judges them (that would bias the output).
            share_prefix: escalations reuse the slim forward's layers [0, p) (p: the first layer
                the mask touches) instead of running the target from layer 0. Needs `slim` to
                be a `SlimModel` view of `target`; no effect without a policy or when p = 0.
            gate: decides from the draft alone whether a block gets a slim pass at all; blocks it
                refuses go straight to the full model (the lossless path). None: every block.
        """
        if policy is not None and slim is None:
            raise ValueError("a tier policy needs a slim verifier: set `slim`")
        self.check_settings(max_unverified=max_unverified)
        self.target = CausalLMRunner(target, "target")
        self.slim: CausalLMRunner | None = None
        self.shared: SharedPrefixRunner | None = None  # behind `target` and `slim` when they share layers
        if policy is not None:
            assert slim is not None  # refused above
            slim_model = slim if isinstance(slim, (PreTrainedModel, SlimModel)) else slim(target)
            if share_prefix:
                shared = SharedPrefixRunner(target, slim_model)
                if shared.num_prefix_layers > 0:  # p = 0 shares nothing: keep the plain runners
                    self.shared = shared
                    self.target, self.slim = shared.target, shared.slim
            if self.slim is None:
                if isinstance(slim_model, SlimModel):
                    compile_view(slim_model, target)
                self.slim = CausalLMRunner(slim_model, "slim")
            if self.slim.vocab_size != self.target.vocab_size:
                raise ValueError(
                    f"the slim verifier's vocabulary ({self.slim.vocab_size}) differs from the"
                    f" target's ({self.target.vocab_size}): use a model of the target's tokenizer"
                )
        self.policy = policy
        self.max_unverified = max_unverified
        self.rejudge = rejudge
        self.gate = gate
        self._refused_at: int | None = None  # the sequence length at which a tree round left the next position to q

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def context_length(self) -> int:
        return self.target.context_length

    def reset(self) -> None:
        self._refused_at = None
        if self.shared is not None:
            self.shared.reset()
            return
        self.target.reset()
        if self.slim is not None:
            self.slim.reset()

    @property
    def stats(self) -> dict[str, CallStats]:
        runners = [self.target] + ([self.slim] if self.slim is not None else [])
        return {r.name: r.stats for r in runners}

    def unverified_length(self, input_ids: torch.Tensor) -> int:
        """Committed tokens the full model has not seen (the last one never is: it is fed next)."""
        return input_ids.shape[1] - 1 - common_prefix_length(self.target.cached_ids, input_ids[0])

    def _slim_room(self, lag: int, tree: DraftTree) -> int:
        """How far the slim tier may commit (`decide`'s room), 0 where it gets no pass at all."""
        room = self.max_unverified - lag
        if self.policy is None or len(tree) == 0 or room <= 0:  # nothing the slim tier could settle
            return 0
        if self.gate is not None and not any(  # it would escalate anyway
            self.gate.use_slim(tree.tokens[path], tree.draft_probs(self.vocab_size)[path]) for path in tree.paths
        ):
            return 0
        return room

    def verify(self, input_ids: torch.Tensor, draft: DraftBlock, sampler: Sampler) -> Verdict:
        K = len(draft)
        p = draft.draft_probs(self.vocab_size)  # [K, V]
        sequence = torch.cat([input_ids, draft.tokens[None]], dim=1)  # [1, T + K]
        room = self._slim_room(self.unverified_length(input_ids), DraftTree.chain(draft.tokens, p))
        if room == 0:
            return self._escalate(sequence, draft, p, sampler, start=0)
        assert self.slim is not None and self.policy is not None  # room comes with a policy, a policy with u

        # 1. slim verify: one forward over the block; 2. tiers 1-2 (`decide`)
        u = SlimScores.of(self.slim.logits(sequence, K + 1), sampler)  # K + 1 positions
        decision = decide(self.policy, draft.tokens, p, u, sampler, room)
        n = decision.num_accepted
        if decision.tier != Tier.ESCALATE:
            tokens = draft.tokens[:n]
            if decision.token is not None:
                tokens = torch.cat([tokens, tokens.new_tensor([decision.token])])
            return Verdict(tokens, n, K, decision.counts(), decision.last_tier)
        # 3. escalate. Sampling keeps tier 1's tokens: re-judging tokens u accepted would bias q's
        # rule (they are no longer plain draws from p).
        start = 0 if self.rejudge and sampler.config.greedy else n
        return self._escalate(sequence, draft, p, sampler, start)

    def _escalate(self, sequence, draft, p, sampler, start: int) -> Verdict:
        """The full model judges draft tokens start..K-1 (tokens before `start` stay accepted)."""
        K = len(draft)
        logits = self.target.logits(sequence, K + 1 - start)  # [K + 1 - start, V]
        outcome = lossless_accept(draft.tokens[start:], p[start:], logits, sampler)
        n = start + outcome.num_accepted
        tokens = torch.cat([draft.tokens[:n], draft.tokens.new_tensor([outcome.next_token])])
        counts: dict[str, int] = {Tier.ESCALATE: outcome.num_accepted + 1}
        if start:
            counts[Tier.ACCEPT] = start
        return Verdict(tokens, n, K, counts, Tier.ESCALATE)

    def verify_tree(self, input_ids: torch.Tensor, tree: DraftTree, sampler: Sampler, judge: TreeJudge) -> TreeVerdict:
        """Judge a draft `tree` after `input_ids` ([1, T], committed); `judge` is the full model's side.

        As `verify`, with two differences a tree's judge imposes: it judges a whole tree from the
        root, so an escalation re-judges tier 1's drafts (greedy with `rejudge`), or else the drafts
        tier 1 kept are committed now and the full model judges the next position, in the next
        round's tree; and its caches are the host's (the lag is read from `judge.cached_length`).
        """
        T = input_ids.shape[1]
        refused, self._refused_at = self._refused_at == T, None
        room = 0 if refused else self._slim_room(T - 1 - judge.cached_length, tree)
        if room == 0:
            return judged(judge.judge(input_ids, tree, sampler), tree)
        assert self.slim is not None and self.policy is not None  # room comes with a policy, a policy with u
        if not isinstance(self.slim.model, SlimModel) or self.shared is not None:
            raise ValueError(
                "a draft tree is verified by a routed view of the target (no share_prefix, no independent middle model)"
            )

        # 1. slim verify: one forward over the tree; 2. tiers 1-2 on the path u follows
        u_logits, features = score_tree(self.slim, input_ids, tree)  # [N + 1, V], [1, N + 1, H]
        chosen = decide_tree(self.policy, tree, SlimScores.of(u_logits, sampler), sampler, room)
        decision = chosen.decision
        n = decision.num_accepted
        kept = chosen.path[:n]
        rejudged = decision.tier == Tier.ESCALATE and (n == 0 or self.rejudge and sampler.config.greedy)
        if not rejudged:
            keep_path(self.slim, input_ids, tree, kept)
            tokens = tree.tokens[kept]
            if decision.token is not None:
                tokens = torch.cat([tokens, tokens.new_tensor([decision.token])])
            counts: dict[str, int]
            if decision.tier == Tier.ESCALATE:  # tier 1's drafts are kept (sampling: see `verify`)
                self._refused_at = T + n
                counts, last = {Tier.ACCEPT: n}, Tier.ACCEPT
            else:
                counts, last = decision.counts(), decision.last_tier
            rows = torch.cat([kept.new_zeros(1), kept + 1])  # the last committed token's, then the kept drafts'
            return TreeVerdict(tokens, n, tree.max_depth, counts, last, kept, features[:, rows])
        # 3. escalate: the full model judges the whole tree; u's cache keeps the path it accepts
        verdict = judged(judge.judge(input_ids, tree, sampler), tree)
        keep_path(self.slim, input_ids, tree, verdict.path)
        return verdict
