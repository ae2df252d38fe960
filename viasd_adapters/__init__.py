"""VIA-SD: three-tier speculative decoding with a routed slim verifier, for the frameworks people run.

    import viasd_adapters as vsd

    generator = vsd.build(target, draft, routing="qwen2.5-coder-1.5b-4l", tokenizer=tokenizer)
    text = generator.generate_text("Write a haiku about caches.", max_new_tokens=64)
    ids = target.generate(**inputs, custom_generate=generator, max_new_tokens=64)

See `viasd_adapters.api` (the builder) and `viasd_adapters.integrations.transformers`.
"""

__version__ = "0.1.0"  # the package's version: pyproject.toml reads it from here (statically)

from .api import (
    EagleHead,
    GenerateOutput,
    SpeculativeGenerator,
    build,
    describe,
    pretrained_path,
    routing_mask,
    tier_policy,
)
from .decode import DecodeStats
from .draft import Drafter, ModelDrafter, PromptLookupDrafter
from .integrations.transformers import generate as custom_generate
from .models import LoadedModel, ModelSpec, load_model
from .progress import TokenProgress
from .routing import RoutingMask, SlimModel
from .sampling import SamplingConfig
from .verify import ConfidencePolicy, LosslessVerifier, TieredVerifier, TierPolicy

__all__ = [
    "ConfidencePolicy",
    "DecodeStats",
    "Drafter",
    "EagleHead",
    "GenerateOutput",
    "LoadedModel",
    "LosslessVerifier",
    "ModelDrafter",
    "ModelSpec",
    "PromptLookupDrafter",
    "RoutingMask",
    "SamplingConfig",
    "SlimModel",
    "SpeculativeGenerator",
    "TierPolicy",
    "TokenProgress",
    "TieredVerifier",
    "build",
    "custom_generate",
    "describe",
    "load_model",
    "pretrained_path",
    "routing_mask",
    "tier_policy",
]
