"""Drafters: whatever proposes tokens for a verifier to judge."""

from .base import DraftBlock, Drafter
from .cascade import CascadeDrafter
from .model import ModelDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["CascadeDrafter", "DraftBlock", "Drafter", "ModelDrafter", "PromptLookupDrafter"]
