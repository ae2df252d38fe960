"""VIA-SD behind transformers' own `generate` (its `custom_generate` hook, transformers >= 4.56).

Three ways, all with the usual generation arguments (max_new_tokens, do_sample, temperature,
top_p, top_k, eos_token_id) and two extra ones, `seed` / `generator` for sampled runs:

    generator = viasd_adapters.build(target, draft, routing=mask)      # checked once, reused
    out = target.generate(**inputs, custom_generate=generator, max_new_tokens=64)

    out = target.generate(**inputs, custom_generate=viasd_adapters.custom_generate,
                          draft=draft, routing=mask, policy=(0.9, 0.9), max_new_tokens=64)

    out = target.generate(**inputs, custom_generate=str(CUSTOM_GENERATE_DIR),  # a local "repository"
                          draft=draft, routing=mask, max_new_tokens=64)

`generate` prepares the generation config (the model's defaults merged with the call's
arguments), the logits processors and the stopping criteria, then calls the hook instead of its
own loop. The hook refuses what the speculative loop cannot reproduce (beams, repetition
penalties, custom processors or stopping criteria, per-step scores) instead of ignoring it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel

from .. import api
from .outputs import ViasdGenerateOutput  # noqa: F401  (re-exported: what generate returns)

# The folder to pass as `custom_generate="..."`: it holds `custom_generate/generate.py`, the layout
# transformers loads from a Hub repository or a local path.
CUSTOM_GENERATE_DIR = Path(__file__).resolve().parent / "hub"


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config: GenerationConfig | None = None,
    draft=None,
    routing=None,
    policy=api._DEFAULT,
    framework: str = "sd",
    seed: int | None = None,
    generator: torch.Generator | None = None,
    viasd_options: dict | None = None,
    **model_kwargs,
):
    """`target.generate(..., custom_generate=generate, draft=..., routing=..., policy=...)`.

    Builds the decoder for this call (`viasd_adapters.build`: `draft`, `routing`, `policy`,
    `framework`, and `viasd_options` for the rest) and runs it. To build once and call many
    times, pass `custom_generate=viasd_adapters.build(...)` instead.
    """
    viasd = api.build(model, draft, routing=routing, policy=policy, framework=framework, **(viasd_options or {}))
    try:
        return viasd(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            seed=seed,
            generator=generator,
            **model_kwargs,
        )
    finally:
        viasd.close()
