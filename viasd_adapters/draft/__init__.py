"""Drafters: whatever proposes tokens for a verifier to judge."""

from .base import DraftBlock, Drafter
from .model import ModelDrafter

__all__ = ["DraftBlock", "Drafter", "ModelDrafter"]
