"""Lossless acceptance rules, as pure functions of draft tokens and distributions.

Terms (as in Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", and Chen et al. 2023): of K draft tokens x_1..x_K drawn from p, the target's
distributions q_1..q_{K+1} keep the longest acceptable prefix x_1..x_n (*accepted*). If a
token was rejected, the next token is *recovered* from the residual norm(max(0, q - p));
if all K were accepted, a *bonus* token is drawn from q_{K+1}. The output is distributed
exactly as sampling from q alone; with greedy decoding it equals argmax decoding of q.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import Sampler


@dataclass
class Acceptance:
    """The outcome of judging one block."""

    num_accepted: int  # n: leading draft tokens kept, 0 <= n <= K
    next_token: int  # recovered token (n < K) or bonus token (n == K)


def greedy_match(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Acceptance:
    """Keep draft tokens while they equal the target's argmax.

    Args:
        draft_tokens: [K] long.
        target_logits: [K + 1, V]; row i scores the position of draft token i (row K: bonus).
    """
    K = draft_tokens.numel()
    target_tokens = target_logits.argmax(-1)  # [K + 1]
    mismatch = (draft_tokens != target_tokens[:K]).nonzero()
    n = int(mismatch[0]) if mismatch.numel() else K
    return Acceptance(n, int(target_tokens[n]))


def speculative_prefix(
    draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, sampler: Sampler
) -> tuple[int, int | None]:
    """Speculative sampling's accept/recover step over a block, without the bonus draw.

    In order, x_i is accepted with probability min(1, q_i(x_i) / p_i(x_i)); at the first rejection
    the recovered token is drawn from norm(max(0, q_i - p_i)) and the block ends.

    Args:
        draft_tokens: [K] long, x_i ~ p_i.
        p: [K, V] draft distributions.
        q: [K, V] the judging distributions at the same positions (same temperature / top-p as p).
    Returns:
        (n, recovered): n accepted drafts; the recovered token, or None when all K were accepted.
    """
    K = draft_tokens.numel()
    idx = torch.arange(K, device=draft_tokens.device)
    p_x = p[idx, draft_tokens]  # [K]
    q_x = q[idx, draft_tokens]  # [K]
    for i in range(K):
        # u * p < q rather than u < q / p: exact when p(x) is 0 or q(x) is 0.
        if sampler.uniform() * float(p_x[i]) < float(q_x[i]):
            continue
        residual = (q[i] - p[i]).clamp_min(0)
        total = residual.sum()
        if total <= 0:  # p == q up to rounding: the residual is undefined, q itself is right
            return i, sampler.draw(q[i])
        return i, sampler.draw(residual / total)
    return K, None


def rejection_sample(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, sampler: Sampler) -> Acceptance:
    """Speculative sampling: accept x_i with probability min(1, q_i(x_i) / p_i(x_i)).

    Args:
        draft_tokens: [K] long, x_i ~ p_i.
        p: [K, V] draft distributions.
        q: [K + 1, V] target distributions (same temperature / top-p as p).
    """
    K = draft_tokens.numel()
    n, recovered = speculative_prefix(draft_tokens, p, q[:K], sampler)
    return Acceptance(n, sampler.draw(q[K]) if recovered is None else recovered)


def lossless_accept(
    draft_tokens: torch.Tensor, p: torch.Tensor, target_logits: torch.Tensor, sampler: Sampler
) -> Acceptance:
    """Greedy match or speculative sampling, as the sampler's mode says.

    Args:
        draft_tokens: [K] long.
        p: [K, V] draft distributions (ignored when greedy).
        target_logits: [K + 1, V] target logits at the draft positions and the bonus position.
    """
    if sampler.config.greedy:
        return greedy_match(draft_tokens, target_logits)
    return rejection_sample(draft_tokens, p, sampler.probs(target_logits), sampler)
