"""What a speculative generation hands back to transformers' `generate`, and the generation
arguments it refuses: shared by `api.SpeculativeGenerator` and the `custom_generate` hook."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformers import GenerationConfig
from transformers.generation import (
    EosTokenCriteria,
    GenerateDecoderOnlyOutput,
    MaxLengthCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..decode import DecodeStats

if TYPE_CHECKING:
    from ..api import GenerateOutput

# What transformers builds from the generation arguments VIA-SD supports; the loop applies them itself.
_REPRODUCED_PROCESSORS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
_REPRODUCED_CRITERIA = (MaxLengthCriteria, EosTokenCriteria)


@dataclass
class ViasdGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate(..., return_dict_in_generate=True)`'s output, with the decoding statistics."""

    stats: DecodeStats | None = None  # tokens/s, accepted length, tier counts, forward calls per model
    method: str | None = None  # e.g. "VIA-SD on SD"


def check_prepared(logits_processor, stopping_criteria) -> None:
    """Raise ValueError for processors or stopping criteria the speculative loop would not apply."""
    extra = [type(p).__name__ for p in (logits_processor or []) if not isinstance(p, _REPRODUCED_PROCESSORS)]
    extra += [type(c).__name__ for c in (stopping_criteria or []) if not isinstance(c, _REPRODUCED_CRITERIA)]
    if extra:
        raise ValueError(
            f"VIA-SD's speculative loop does not apply {', '.join(extra)}: drop the argument that adds it"
            " (custom logits processors or stopping criteria, stop_strings, max_time, penalties)"
        )


def generate_output(result: GenerateOutput, config: GenerationConfig):
    """What `generate` returns: the [1, T + n] ids, or an output object when the config asks for one."""
    if config.return_dict_in_generate:
        return ViasdGenerateOutput(sequences=result.sequences, stats=result.stats, method=result.method)
    return result.sequences
