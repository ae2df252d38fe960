"""The int8 GEMV computes bit for bit what fbgemm's GEMM computes, and is not used where it cannot run."""

import logging

import pytest
import torch

from viasd_adapters.models import native
from viasd_adapters.models.int8_gemv import GEMV_MAX_ROWS, _channel_sums, fbgemm_only
from viasd_adapters.models.quantize import _RowQuantGemm

pytestmark = pytest.mark.skipif(
    native.cpu_unsupported() is not None, reason=f"the int8 GEMV needs AVX2: {native.cpu_unsupported()}"
)


def _rows(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[:, : min(3, k)] *= 50  # a few outlier channels, as activations have
    return x


def test_the_kernel_is_built_here():
    # On an x86-64 AVX2 CPU with a C compiler (CI's), a missing kernel is a failure, not a skip.
    assert native.load() is None
    assert _RowQuantGemm(torch.randn(8, 32)).gemv is not None


@pytest.mark.parametrize("k, n", [(896, 1152), (1536, 2048), (8960, 96), (100, 37), (33, 5), (31, 4)])
def test_bitwise_fbgemm_at_every_row_count(k, n):
    gemm = _RowQuantGemm(torch.randn(n, k, generator=torch.Generator().manual_seed(k)) * 0.05)
    for m in range(1, 14):  # the kernel takes any row count; the layers give it GEMV_MAX_ROWS
        x = _rows(m, k, seed=m)
        if m == 3:
            x[1] = 0  # an all-zero row: its maximum is clamped, its output zero
        with fbgemm_only():
            expected = gemm(x)
        assert torch.equal(gemm.gemv(x), expected), (k, n, m)
        assert torch.equal(gemm(x), expected), (k, n, m)


def test_strided_rows_and_extreme_scales():
    gemm = _RowQuantGemm(torch.randn(40, 256, generator=torch.Generator().manual_seed(1)))
    x = _rows(4, 512, seed=2)[:, ::2]  # a column-strided view
    x[2] *= 1e-25
    x[3] *= 1e20
    with fbgemm_only():
        expected = gemm(x)
    assert torch.equal(gemm(x), expected)


def test_each_row_is_independent_of_the_others():
    gemm = _RowQuantGemm(torch.randn(64, 320, generator=torch.Generator().manual_seed(3)))
    x = _rows(GEMV_MAX_ROWS, 320, seed=4)
    together = gemm.gemv(x)
    for j in range(x.shape[0]):
        assert torch.equal(gemm.gemv(x[j : j + 1]), together[j : j + 1])


def test_more_rows_than_the_kernel_takes_go_to_fbgemm():
    gemm = _RowQuantGemm(torch.randn(16, 64))
    x = _rows(GEMV_MAX_ROWS + 3, 64, seed=5)
    with fbgemm_only():
        expected = gemm(x)
    assert torch.equal(gemm(x), expected)
    with pytest.raises(RuntimeError, match="1-64 allowed"):
        gemm.gemv(_rows(65, 64, seed=6))


def test_a_failed_build_falls_back_to_fbgemm_with_a_log_line(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    native.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=native.__name__):
            gemm = _RowQuantGemm(torch.randn(16, 64))
        assert gemm.gemv is None
        assert "native operators not used" in caplog.text
        x = _rows(2, 64, seed=7)
        with fbgemm_only():
            expected = gemm(x)
        assert torch.equal(gemm(x), expected)
    finally:
        native.load.cache_clear()  # the next caller builds (or finds) the real kernel again


def test_values_on_half_steps_round_as_fbgemm_does():
    # Activations a hair from a half step of the quantisation grid: rounding x * inverse scale first
    # and adding the zero point after parts from fbgemm on about one value in 20 of these.
    g = torch.Generator().manual_seed(8)
    steps = torch.randint(-63, 63, (2, 512), generator=g).float() + 0.5
    x = (steps / 63.5 * (1 + torch.randn(2, 512, generator=g) * 1e-6)).clamp(-1, 1)
    x[:, 0] = 1.0
    gemm = _RowQuantGemm(torch.eye(512))  # each output is one quantised input
    with fbgemm_only():
        expected = gemm(x)
    assert torch.equal(gemm(x), expected)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_runner_without_the_gemv_runs_fbgemm_and_gets_the_same_logits(compiled):
    from viasd_adapters.models import ModelSpec, load_model
    from viasd_adapters.runner import CausalLMRunner

    model = load_model(ModelSpec("tiny-random", weights="int8", compile=compiled)).model
    ids = torch.tensor([[5, 17, 99, 3, 42, 8]])
    logits = {}
    for gemv in (True, False):
        runner = CausalLMRunner(model, int8_gemv=gemv)
        runner.logits(ids[:, :-1], 1)
        with torch.profiler.profile() as profile:  # the compiled graph calls the operator from C++
            logits[gemv] = runner.logits(ids, 1)  # one new row: the GEMV's case
        calls = [e.key for e in profile.key_averages() if e.key == "viasd::w8a8_gemv"]
        assert bool(calls) == gemv
    assert torch.equal(logits[True], logits[False])


@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (896, 4864)])
@pytest.mark.parametrize("values", [(-127, 128), (-128, -127), (127, 128)])
def test_the_channel_sums_are_exact(shape, values):
    # the fast path is an int8 product with ones: no saturation at the int8 extremes, any shape
    weight = torch.randint(*values, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_channel_sums(weight), weight.sum(1, dtype=torch.int32))
