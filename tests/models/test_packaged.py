"""The one-token layer's AOTInductor package (`models.packaged`): bitwise the `torch.compile` graph
it stands in for, one package for every buffer size, found again by the next step of the same
model, built again when its file is damaged, and a warning and the compiled graph where it cannot
be built."""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from viasd_adapters.models import ModelSpec, load_model, native
from viasd_adapters.models.compiled import KV_GROWTH, DecodeStep, decode_step
from viasd_adapters.models.packaged import PackagedLayer
from viasd_adapters.runner import CausalLMRunner

pytestmark = pytest.mark.skipif(native._cpu_supported() is not None, reason=f"{native._cpu_supported()}")

LOGGER = "viasd_adapters.models.packaged"


@pytest.fixture(scope="module")
def model():
    return load_model(ModelSpec("tiny-random", weights="int8", compile=True)).model


def _ids(n: int) -> torch.Tensor:
    return torch.randint(1, 250, (1, n), generator=torch.Generator().manual_seed(0))


PREFIX = _ids(9)
IDS = torch.cat([PREFIX, torch.tensor([[7]])], dim=1)  # one new row after PREFIX: a one-token step


def _runner(model, step: DecodeStep) -> CausalLMRunner:
    runner = CausalLMRunner(model)
    runner.step, runner.cache = step, step.new_cache()
    return runner


def _graph_only(step: DecodeStep) -> DecodeStep:
    """The same step with every one-row call on the `torch.compile` graph."""
    twin = copy.copy(step)
    twin._one_row = step._one_row.fallback
    return twin


def _next_logits(model, step: DecodeStep) -> torch.Tensor:
    """The logits of IDS' last token, a one-token step after PREFIX."""
    runner = _runner(model, step)
    runner.logits(PREFIX, 1)
    return runner.logits(IDS, 1)


@torch.no_grad()
def test_steps_run_the_package_bitwise_as_the_compiled_graph_across_a_buffer_growth(model):
    step = decode_step(model)
    assert isinstance(step._one_row, PackagedLayer) and step._one_row.failed is None
    ids = _ids(KV_GROWTH + 12)
    packaged, compiled = _runner(model, step), _runner(model, _graph_only(step))
    start = KV_GROWTH - 8
    for runner in (packaged, compiled):
        runner.logits(ids[:, :start], 1)
    runs, runner = [], step._one_row._runner
    step._one_row._runner = SimpleNamespace(run=lambda inputs: runs.append(1) or runner.run(inputs))
    try:
        for length in range(start + 1, ids.shape[1] + 1):
            assert torch.equal(packaged.logits(ids[:, :length], 1), compiled.logits(ids[:, :length], 1)), length
    finally:
        step._one_row._runner = runner
    assert packaged.cache.capacity == 2 * KV_GROWTH  # the buffers grew while the same package ran
    assert len(runs) == (ids.shape[1] - start) * len(step.layers)


@torch.no_grad()
def test_the_next_step_of_the_same_model_loads_the_package(model, caplog):
    reference = _next_logits(model, decode_step(model))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert torch.equal(_next_logits(model, DecodeStep(model)), reference)
    assert "loaded the one-token layer's package" in caplog.text


@pytest.mark.slow  # builds the package once more (about 17 s)
@torch.no_grad()
def test_a_damaged_package_is_built_again(model, caplog):
    reference = _next_logits(model, decode_step(model))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _next_logits(model, DecodeStep(model))
    path = caplog.text.split("loaded the one-token layer's package in ")[1].split(": ", 1)[1].split()[0]
    with open(path, "wb") as f:
        f.write(b"not a package")
    caplog.clear()
    rebuilt = DecodeStep(model)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert torch.equal(_next_logits(model, rebuilt), reference)
    assert "could not be read" in caplog.text and "built the one-token layer's package" in caplog.text
    assert rebuilt._one_row.failed is None


@torch.no_grad()
def test_where_export_fails_the_compiled_graph_runs_every_call_with_a_warning(model, monkeypatch, caplog):
    reference = _next_logits(model, decode_step(model))

    def refuse(*args, **kwargs):
        raise RuntimeError("cannot trace this")

    monkeypatch.setattr(torch.export, "export", refuse)
    step = DecodeStep(model)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert torch.equal(_next_logits(model, step), reference)
    assert "runs its torch.compile graph, not a package: RuntimeError: cannot trace this" in caplog.text
    assert step._one_row.failed and step._one_row._runner is None
