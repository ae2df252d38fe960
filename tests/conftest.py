"""Shared fixtures: tiny random models built in memory (nothing is downloaded)."""

from __future__ import annotations

import copy
import importlib
import os

import pytest
import torch

from viasd_adapters.models import LoadedModel, ModelSpec, TinyModelConfig
from viasd_adapters.models.tiny import build_tiny_model, perturb_weights


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """Under `make test`'s workers (`--dist loadgroup`), the tests that convert or load the Qwen
    models share one worker: two 1.5B models at once (9 GB each while converting, 8 GB for the int8
    pair's test) would not fit a small CI machine's memory."""
    for item in items:
        if item.get_closest_marker("large_models"):
            item.add_marker(pytest.mark.xdist_group("large_models"))


def import_or_skip_outside_ci(module: str):
    """`module`, imported; outside CI a missing one skips the test, under CI (CI=true, as `.ci/run`
    sets it) it fails it: there the setup installs every optional host (`make setup`)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def tiny(seed: int = 0, num_layers: int = 4, dtype: str = "float32", **kw) -> LoadedModel:
    return build_tiny_model(
        ModelSpec("tiny-random", weights=dtype, tiny=TinyModelConfig(seed=seed, num_layers=num_layers, **kw))
    )


def perturbed(model: torch.nn.Module, scale: float, seed: int = 1) -> torch.nn.Module:
    """A copy of `model` with relative Gaussian noise on every weight: a draft that mostly agrees."""
    return perturb_weights(copy.deepcopy(model), scale, seed)


@torch.no_grad()
def exact_marginals(model: torch.nn.Module, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """[steps, V]: the exact marginal of each of the first `steps` tokens sampled (temperature 1)
    after `prompt` [1, T], by enumerating all V ** (steps - 1) continuations."""
    prefixes, weights, marginals = prompt, torch.ones(1), []  # [B, T], [B]
    for step in range(steps):
        q = torch.cat([torch.softmax(model(b).logits[:, -1], -1) for b in prefixes.split(4096)])  # [B, V]
        marginals.append(weights @ q)
        if step + 1 < steps:
            V = q.shape[1]
            weights = (weights[:, None] * q).reshape(-1)  # row b * V + v: prefix b, then token v
            prefixes = torch.cat([prefixes.repeat_interleave(V, 0), torch.arange(V).repeat(len(prefixes))[:, None]], 1)
    return torch.stack(marginals)


def tiny_pair_config(*overrides: str):
    """The `tiny-random` model pair config (fp32 by default), as the CLIs compose it."""
    from tests.test_configs import compose_generate

    return compose_generate(
        "model_pair=tiny-random", "runtime.weights=float32", "runtime.draft_weights=float32", *overrides
    ).model_pair


@pytest.fixture(scope="session")
def tiny_pair():
    """The `tiny-random` pair in fp32: a 4-layer target and a perturbed copy of it as the draft
    (acceptance between 0.4 and 0.9: tests/test_generate.py checks it)."""
    from viasd_adapters.pipeline import load_pair

    return load_pair(tiny_pair_config())


@pytest.fixture(scope="session")
def tiny_target(tiny_pair) -> LoadedModel:
    return tiny_pair.target


@pytest.fixture(scope="session")
def tiny_draft(tiny_pair) -> torch.nn.Module:
    return tiny_pair.draft.model
