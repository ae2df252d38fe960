"""Shared fixtures: tiny random models built in memory (nothing is downloaded)."""

from __future__ import annotations

import copy

import pytest
import torch

from viasd_adapters.models import LoadedModel, ModelSpec, TinyModelConfig
from viasd_adapters.models.tiny import build_tiny_model


def tiny(seed: int = 0, num_layers: int = 4, dtype: str = "float32", **kw) -> LoadedModel:
    return build_tiny_model(
        ModelSpec("tiny-random", dtype=dtype, tiny=TinyModelConfig(seed=seed, num_layers=num_layers, **kw))
    )


def perturbed(model: torch.nn.Module, scale: float, seed: int = 1) -> torch.nn.Module:
    """A copy of `model` with relative Gaussian noise on every weight: a draft that mostly agrees."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * scale)
    return draft


@pytest.fixture(scope="session")
def tiny_target() -> LoadedModel:
    return tiny(seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_target) -> torch.nn.Module:
    return perturbed(tiny_target.model, scale=0.02)
