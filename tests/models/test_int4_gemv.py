"""4-bit draft steps (`ModelDrafter(quantize="int4")`, models/int4_gemv.py): the kernel computes the
stated arithmetic, steps read the 4-bit weights and long blocks fbgemm's int8, the source model is
untouched, and a drafter with them stays lossless."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import perturbed, tiny
from tests.decode.test_loops import PROMPT
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.models import ModelSpec, TinyModelConfig, int4_gemv, load_model, native
from viasd_adapters.models.compiled import attach_step, decode_step
from viasd_adapters.models.int4_gemv import GROUP, Int4Gemv, dequantize_int4, four_bit_copy, quantize_int4
from viasd_adapters.models.int8_gemv import fbgemm_only
from viasd_adapters.models.quantize import int8_products, quantize_linears
from viasd_adapters.models.vocab import DraftVocabulary
from viasd_adapters.runner import CausalLMRunner
from viasd_adapters.verify import LosslessVerifier

pytestmark = pytest.mark.skipif(
    native.cpu_unsupported() is not None, reason=f"the 4-bit GEMV needs AVX2: {native.cpu_unsupported()}"
)


def reference_w4a8(packed: torch.Tensor, scales: torch.Tensor, minima: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic written out in float64: rows to int8 by their absolute maximum, the
    4-bit weights dequantised (unpacked here independently of `dequantize_int4`)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    low, high = (packed & 0x0F).reshape(n, -1, GROUP // 2), (packed >> 4).reshape(n, -1, GROUP // 2)
    levels = torch.cat([low, high], dim=2).double()  # [N, G, GROUP]: weight j, then weight j + 32
    w = (levels * scales.double()[:, :, None] + minima.double()[:, :, None]).reshape(n, k)[:, : x.shape[1]]
    scale = x.double().abs().amax(1, keepdim=True) / 127
    return torch.round(x.double() / scale) @ w.T * scale


@pytest.mark.parametrize("n, k", [(40, 64), (37, 896), (5, 100), (96, 200)])
def test_the_kernel_computes_the_stated_product(n, k):
    g = torch.Generator().manual_seed(k)
    gemv = Int4Gemv(torch.randn(n, k, generator=g) * 0.05)
    for rows in (1, 2, 3, 4, 7):
        x = torch.randn(rows, k, generator=g) * 3
        x[:, 0] *= 40  # an outlier channel
        expected = reference_w4a8(*gemv.args, x)
        assert torch.allclose(gemv(x).double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
        assert torch.equal(gemv(x[:1]), gemv(x)[:1])  # each row by itself
    x = torch.randn(3, k, generator=g)
    x[1, k // 2] = float("nan")
    x[2] = 0
    y = gemv(x)
    assert y[1].isnan().all() and not y[[0, 2]].isnan().any() and (y[2] == 0).all()  # a NaN row, a zero row


def test_weights_on_the_grid_are_kept_and_others_no_worse_than_the_plain_range():
    g = torch.Generator().manual_seed(0)
    scales, minima = torch.rand(6, 2, 1, generator=g) + 0.5, torch.randn(6, 2, 1, generator=g)
    levels = torch.randint(0, 16, (6, 2, GROUP), generator=g).float()
    levels[:, :, :2] = torch.tensor([0.0, 15.0])  # the group spans all 16 levels: that span is a candidate
    grid = (levels * scales + minima).reshape(6, 2 * GROUP)
    assert torch.allclose(dequantize_int4(*quantize_int4(grid)), grid, rtol=0, atol=1e-5)
    w = torch.randn(6, 2, GROUP, generator=g) ** 3  # heavy tails: clipping the extremes can pay
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    plain = ((w - low) / ((high - low) / 15)).round() * ((high - low) / 15) + low
    chosen = dequantize_int4(*quantize_int4(w.reshape(6, -1))).reshape(6, 2, GROUP)
    chosen_error, plain_error = ((chosen - w) ** 2).sum(-1), ((plain - w) ** 2).sum(-1)
    assert (chosen_error <= plain_error * (1 + 1e-5)).all() and (chosen_error < plain_error * 0.99).any()


def test_steps_read_the_4_bit_weights_long_blocks_fbgemm_and_the_source_is_untouched():
    model = quantize_linears(tiny().model, "int8")
    int8_logits = {rows: model(PROMPT[:, :rows]).logits for rows in (3, 9)}
    copy = four_bit_copy(model)
    assert all(isinstance(gemm.gemv, Int4Gemv) for gemm in int8_products(copy))
    assert not any(isinstance(gemm.gemv, Int4Gemv) for gemm in int8_products(model))
    assert not torch.equal(copy(PROMPT[:, :3]).logits, int8_logits[3])  # 3 rows: the 4-bit product
    assert torch.equal(copy(PROMPT[:, :9]).logits, int8_logits[9])  # 9 rows: fbgemm's int8, unchanged
    with fbgemm_only():
        assert torch.equal(copy(PROMPT[:, :3]).logits, int8_logits[3])
    assert torch.equal(model(PROMPT[:, :3]).logits, int8_logits[3])
    shared = {id(t) for t in model.parameters()}
    assert all(id(t) in shared for t in copy.parameters())  # nothing but the 4-bit weights is new


def test_4_bit_weights_are_cached_by_the_int8_weights_they_come_from(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    model = quantize_linears(tiny().model, "int8")
    four_bit_copy(model)
    assert not (tmp_path / "int4").exists()  # a small model's are not worth a file
    monkeypatch.setattr(int4_gemv, "CACHED_FROM_WEIGHTS", 0)
    made = four_bit_copy(model)
    (path,) = (tmp_path / "int4").iterdir()

    def refuse(*_):
        raise AssertionError("quantised although cached")

    quantize = int4_gemv.quantize_int4
    monkeypatch.setattr(int4_gemv, "quantize_int4", refuse)
    read = four_bit_copy(model)
    for a, b in zip(int8_products(made), int8_products(read), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.gemv.args, b.gemv.args, strict=True))
    assert torch.equal(read(PROMPT[:, :3]).logits, made(PROMPT[:, :3]).logits)
    other = quantize_linears(perturbed(tiny().model, 0.05), "int8")
    with pytest.raises(AssertionError, match="quantised although cached"):
        four_bit_copy(other)  # other int8 weights: not this file's
    monkeypatch.setattr(int4_gemv, "quantize_int4", quantize)
    again = four_bit_copy(made)  # from a copy's products, whose int8 weights come unpacked: the same levels
    for a, b in zip(int8_products(made), int8_products(again), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.gemv.args, b.gemv.args, strict=True))
    path.write_bytes(path.read_bytes()[:1000])  # truncated: remade
    with caplog.at_level("WARNING"):
        remade = four_bit_copy(model)
    assert "unreadable" in caplog.text
    assert torch.equal(remade(PROMPT[:, :3]).logits, made(PROMPT[:, :3]).logits)
    monkeypatch.setattr(int4_gemv, "FORMAT", int4_gemv.FORMAT + 1)  # another format: remade, not trusted
    with caplog.at_level("WARNING"):
        four_bit_copy(model)
    assert "made from other files or settings" in caplog.text


def test_a_reduced_head_keeps_its_rows_4_bit(tmp_path):
    model = quantize_linears(tiny().model, "int8")
    vocabulary = DraftVocabulary(token_ids=list(range(0, 257, 2)), vocab_size=257).save(tmp_path / "v.json")
    drafter = ModelDrafter(model, quantize="int4", vocabulary=str(vocabulary))
    hidden = torch.randn(2, model.config.hidden_size)
    full = drafter.runner.model.get_output_embeddings()(hidden)
    assert isinstance(drafter.head.int8._gemms[0].gemv, Int4Gemv)
    assert torch.equal(drafter.head(hidden), full[:, drafter.head.token_ids])
    assert drafter.runner.variant == f"int8+int4@{vocabulary}"  # the profile's label of this drafter


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_greedy_sd_with_a_4_bit_draft_reproduces_int8_ar(compiled):
    target = load_model(ModelSpec("tiny-random", weights="int8", tiny=TinyModelConfig(), compile=compiled)).model
    draft = quantize_linears(perturbed(tiny().model, 0.05), "int8")
    if compiled:
        attach_step(draft)
    ar = AutoregressiveDecoder(target).generate(PROMPT, 40)
    drafter = ModelDrafter(draft, quantize="int4")
    assert (drafter.runner.step is not None) == compiled
    out = SpeculativeDecoder(drafter, LosslessVerifier(target), num_draft_tokens=4).generate(PROMPT, 40)
    assert out.tokens == ar.tokens
    assert 0 < out.stats.accepted < out.stats.drafted


def test_the_compiled_step_runs_the_4_bit_product():
    """The copy's compiled one-row step calls the 4-bit operator: its logits part from the int8
    model's and stay near the eager 4-bit copy's (another rounding of the same weights)."""
    model = load_model(ModelSpec("tiny-random", weights="int8", tiny=TinyModelConfig(), compile=True)).model
    copy = four_bit_copy(model)
    logits = {}
    for name, source, compiled in (("int4", copy, True), ("int4-eager", copy, False), ("int8", model, True)):
        runner = CausalLMRunner(source, compiled=compiled)
        assert (runner.step is not None) == compiled
        runner.logits(PROMPT[:, :8], 1)
        logits[name] = runner.logits(PROMPT[:, :9], 1)[-1]
    assert decode_step(copy) is not decode_step(model)
    assert not torch.allclose(logits["int4"], logits["int8"], atol=1e-3)
    assert torch.allclose(logits["int4"], logits["int4-eager"], atol=0.05 * logits["int4-eager"].abs().max())


def test_a_draft_without_int8_products_is_refused():
    with pytest.raises(ValueError, match="runtime.draft_weights=int8"):
        ModelDrafter(tiny().model, quantize="int4")


def test_framework_sd_int4_decodes_as_int8_ar():
    from tests.test_configs import compose_generate
    from viasd_adapters.cli.generate import run

    runtime = ("model_pair=tiny-random", "runtime.weights=int8", "runtime.draft_weights=int8", "max_new_tokens=12")
    _, ar = run(compose_generate(*runtime, "framework=ar"))
    _, sd = run(compose_generate(*runtime, "framework=sd-int4"))
    assert sd.tokens == ar.tokens
    assert sd.stats.drafted > 0
