"""Verifiers: what judges draft tokens, tier by tier."""

from .acceptance import Acceptance, greedy_match, lossless_accept, rejection_sample
from .base import Verdict, Verifier
from .cascade import SpeculativeCascadeVerifier, token_deferral
from .lossless import LosslessVerifier
from .policy import ConfidencePolicy, Tier, TierPolicy
from .tiered import TieredVerifier

__all__ = [
    "Acceptance",
    "ConfidencePolicy",
    "LosslessVerifier",
    "Tier",
    "TierPolicy",
    "TieredVerifier",
    "SpeculativeCascadeVerifier",
    "Verdict",
    "Verifier",
    "greedy_match",
    "lossless_accept",
    "rejection_sample",
    "token_deferral",
]
