"""The decoder layer's AOTInductor package (`models.packaged`): bitwise the `torch.compile` graphs
it stands in for at 1-4 rows, one package for every buffer size, found again by the next step of
the same model, built again when its file is damaged, and a warning and the compiled graphs where
it cannot be built."""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from viasd_adapters.models import ModelSpec, load_model, native
from viasd_adapters.models.compiled import KV_GROWTH, DecodeStep, decode_step
from viasd_adapters.models.int8_gemv import GEMV_MAX_ROWS
from viasd_adapters.models.packaged import PackagedLayer
from viasd_adapters.runner import CausalLMRunner

pytestmark = pytest.mark.skipif(native.cpu_unsupported() is not None, reason=f"{native.cpu_unsupported()}")

LOGGER = "viasd_adapters.models.packaged"


@pytest.fixture(scope="module")
def model():
    return load_model(ModelSpec("tiny-random", weights="int8", compile=True)).model


def _ids(n: int) -> torch.Tensor:
    return torch.randint(1, 250, (n,), generator=torch.Generator().manual_seed(0))


PREFIX = _ids(9)[None]
IDS = torch.cat([PREFIX, torch.tensor([[7]])], dim=1)  # one new row after PREFIX: a one-token step


def _graphs_only(step: DecodeStep) -> DecodeStep:
    """The same step with every call on the `torch.compile` graphs."""
    twin = copy.copy(step)
    twin._packaged = None
    return twin


def _next_logits(model, step: DecodeStep) -> torch.Tensor:
    """The logits of IDS' last token, a one-token step after PREFIX."""
    runner = CausalLMRunner(model)
    runner.step, runner.cache = step, step.new_cache()
    runner.logits(PREFIX, 1)
    return runner.logits(IDS, 1)


@torch.no_grad()
def test_steps_and_verify_blocks_run_the_package_bitwise_as_the_graphs_across_a_buffer_growth(model):
    step = decode_step(model)
    assert isinstance(step._packaged, PackagedLayer) and step._packaged.failed is None
    graphs = _graphs_only(step)
    ids = _ids(KV_GROWTH + 40)
    start = KV_GROWTH - 20
    packaged_cache, graph_cache = step.new_cache(), graphs.new_cache()
    step(ids[:start], packaged_cache)
    graphs(ids[:start], graph_cache)
    runs, runner = [], step._packaged._runner
    step._packaged._runner = SimpleNamespace(run=lambda inputs: runs.append(1) or runner.run(inputs))
    sizes = [1, 2, 1, 3, GEMV_MAX_ROWS, 1, 2] * 3 + [GEMV_MAX_ROWS + 1]  # the last: the block graph
    try:
        for n in sizes:
            rows = ids[packaged_cache.length : packaged_cache.length + n]
            assert torch.equal(step(rows, packaged_cache), graphs(rows, graph_cache)), (n, packaged_cache.length)
    finally:
        step._packaged._runner = runner
    assert packaged_cache.capacity == 2 * KV_GROWTH  # the buffers grew while the same package ran
    assert len(runs) == (len(sizes) - 1) * len(step.layers)


@torch.no_grad()
def test_the_next_step_of_the_same_model_loads_the_package(model, caplog):
    reference = _next_logits(model, decode_step(model))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert torch.equal(_next_logits(model, DecodeStep(model)), reference)
    assert "loaded the decoder layer's package" in caplog.text


@pytest.mark.slow  # builds the package once more (about 17 s)
@torch.no_grad()
def test_a_damaged_package_is_built_again(model, caplog):
    reference = _next_logits(model, decode_step(model))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _next_logits(model, DecodeStep(model))
    path = caplog.text.split("loaded the decoder layer's package (1-")[1].split(": ", 1)[1].split()[0]
    with open(path, "wb") as f:
        f.write(b"not a package")
    caplog.clear()
    rebuilt = DecodeStep(model)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert torch.equal(_next_logits(model, rebuilt), reference)
    assert "could not be read" in caplog.text and "built the decoder layer's package" in caplog.text
    assert rebuilt._packaged.failed is None


@torch.no_grad()
def test_where_export_fails_the_compiled_graphs_run_every_call_with_a_warning(model, monkeypatch, caplog):
    reference = _next_logits(model, decode_step(model))

    def refuse(*args, **kwargs):
        raise RuntimeError("cannot trace this")

    monkeypatch.setattr(torch.export, "export", refuse)
    step = DecodeStep(model)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert torch.equal(_next_logits(model, step), reference)
    assert "runs its torch.compile graphs, not a package: RuntimeError: cannot trace this" in caplog.text
    assert step._packaged.failed and step._packaged._runner is None
