"""Decoding loops: autoregressive and speculative, and the statistics they record."""

from .loops import AutoregressiveDecoder, Decoder, GenerationResult, SpeculativeDecoder
from .stats import DecodeStats

__all__ = ["AutoregressiveDecoder", "DecodeStats", "Decoder", "GenerationResult", "SpeculativeDecoder"]
