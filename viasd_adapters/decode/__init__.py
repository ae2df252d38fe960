"""Decoding loops: autoregressive and speculative, and the statistics they record."""

from .loops import AutoregressiveDecoder, CommittedSequence, Decoder, GenerationResult, SpeculativeDecoder
from .stats import DecodeStats, RankAcceptance

__all__ = [
    "AutoregressiveDecoder",
    "CommittedSequence",
    "DecodeStats",
    "RankAcceptance",
    "Decoder",
    "GenerationResult",
    "SpeculativeDecoder",
]
