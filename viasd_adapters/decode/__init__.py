"""Decoding loops: autoregressive and speculative, and the statistics they record."""

from .loops import AutoregressiveDecoder, CommittedSequence, Decoder, GenerationResult, SpeculativeDecoder
from .stats import DecodeStats

__all__ = [
    "AutoregressiveDecoder",
    "CommittedSequence",
    "DecodeStats",
    "Decoder",
    "GenerationResult",
    "SpeculativeDecoder",
]
