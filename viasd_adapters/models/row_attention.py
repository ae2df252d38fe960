"""Attention that computes each query row as a one-token decode step would: `sdpa-rows`.

SDPA over a block of n queries rounds differently from n one-token calls (other kernels, other
reduction orders). In fp32 or bf16 that moves logits by ~1e-6 and flips only near-ties; before
an int8 linear layer it can flip a quantisation level, and the verify of a block then disagrees
with the steps it replaces (measured on Qwen2.5-Coder-1.5B: logits 2.1 apart). Here a block's
row j attends, as one query, to exactly the keys the step at its position sees, with the call
that step makes (no mask): a row's output never depends on the rows beside it. A row whose mask
is not a prefix of the keys (a draft tree) is computed under its own mask row instead.
Costs n SDPA calls per layer instead of one; at decode-sized blocks that is small.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ROW_INVARIANT_ATTENTION = "sdpa-rows"


def row_invariant_sdpa(module, query, key, value, attention_mask, **kwargs):
    """query [B, H, n, D], key / value [B, H_kv, kv, D] (the last n keys are the block's own),
    attention_mask None (causal) or [B, 1, n, kv] -> ([B, n, H, D], None)."""
    n, kv = query.shape[2], key.shape[2]
    kwargs.pop("is_causal", None)
    if n == 1 and attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)
    rows = []
    for j in range(n):
        visible, mask = kv - (n - 1 - j), None
        if attention_mask is not None:
            row = attention_mask[:, :, j : j + 1, :]  # [B, 1, 1, kv]
            allowed = row if row.dtype == torch.bool else row == 0
            visible = int(allowed[0, 0, 0].sum())
            if not bool(allowed[..., :visible].all()):
                visible, mask = kv, row  # not a prefix: this row keeps its mask
        out, _ = sdpa_attention_forward(
            module, query[:, :, j : j + 1], key[:, :, :visible], value[:, :, :visible], mask, is_causal=False, **kwargs
        )
        rows.append(out)  # [B, 1, H, D]
    return torch.cat(rows, dim=1), None


# Registering is idempotent; masks are prepared as for sdpa.
AttentionInterface.register(ROW_INVARIANT_ATTENTION, row_invariant_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(ROW_INVARIANT_ATTENTION, sdpa_mask)
