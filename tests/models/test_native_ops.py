"""The native operators (`models.native`): the C++ row attention computes what its Python reference
computes, the one-row graph calls both operators from C++, and without them the step falls back to
Python with the same logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from viasd_adapters.models import ModelSpec, load_model, native
from viasd_adapters.models.compiled import _attend, inductor_cache_dir
from viasd_adapters.runner import CausalLMRunner

pytestmark = pytest.mark.skipif(native.cpu_unsupported() is not None, reason=f"{native.cpu_unsupported()}")

IDS = torch.tensor([[5, 17, 99, 3, 42, 8, 120, 7]])


def _attention_inputs(n: int, dtype: torch.dtype, seed: int, tree: bool):
    g = torch.Generator().manual_seed(seed)
    Hkv, G, S, D, held = 2, 3, 128, 16, 40
    keys, values = (torch.randn(Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    write = torch.arange(held, held + n)
    k, v = (torch.randn(Hkv, n, D, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(n, Hkv, G, D, generator=g)
    if not tree:
        return keys, values, write, k, v, q, write + 1, None
    # each row reads the prefix and a random subset of the new rows (itself included), gathered first
    visible = torch.zeros(n, 64, dtype=torch.bool)
    visible[:, :held] = True
    visible[:, held : held + n] = torch.rand(n, n, generator=g) < 0.5
    visible[torch.arange(n), held + torch.arange(n)] = True
    order = torch.argsort((~visible).to(torch.uint8), dim=1, stable=True)
    return keys, values, write, k, v, q, visible.sum(1), order


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 5])
def test_the_native_attention_is_bitwise_its_python_reference(n, dtype, tree):
    assert native.load() is None
    inputs = _attention_inputs(n, dtype, seed=n, tree=tree)
    keys, values, *rest = inputs
    python_keys, python_values = keys.clone(), values.clone()
    out = torch.ops.viasd.attend(keys, values, *rest)
    expected = _attend(python_keys, python_values, *rest)
    assert torch.equal(out, expected)
    assert torch.equal(keys, python_keys) and torch.equal(values, python_values)  # the writes
    assert not torch.equal(keys[:, 40 : 40 + n], inputs[0].new_zeros(2, n, 16))


def test_the_one_row_graph_calls_the_native_operators_from_cpp():
    model = load_model(ModelSpec("tiny-random", weights="int8", compile=True)).model
    runner = CausalLMRunner(model)
    runner.logits(IDS[:, :-1], 1)
    with torch.profiler.profile() as profile:
        runner.logits(IDS, 1)
    ops = {e.key for e in profile.key_averages()}
    assert {"viasd::w8a8_gemv", "viasd::attend"} <= ops
    assert "viasd::w8a8_gemm" not in ops  # the Python object's operator


_FALLBACK = """
import json, logging, torch
from viasd_adapters.models import ModelSpec, load_model, native
from viasd_adapters.runner import CausalLMRunner
logging.basicConfig(level=logging.WARNING)
model = load_model(ModelSpec("tiny-random", weights="int8", compile=True)).model
assert native.load() is not None
runner = CausalLMRunner(model)
runner.logits(torch.tensor({prefix}), 1)
print(json.dumps(runner.logits(torch.tensor({ids}), 1).tolist()))
"""


def test_without_the_native_operators_the_step_runs_in_python_with_the_same_logits(tmp_path):
    model = load_model(ModelSpec("tiny-random", weights="int8", compile=True)).model
    runner = CausalLMRunner(model)
    runner.logits(IDS[:, :-1], 1)
    expected = runner.logits(IDS, 1)
    env = dict(
        os.environ,
        CC=str(tmp_path / "no-such-compiler"),  # the operators cannot be built
        VIASD_CACHE=str(tmp_path),
        TORCHINDUCTOR_CACHE_DIR=str(inductor_cache_dir()),  # this process's graphs: no cold compile
    )
    code = _FALLBACK.format(prefix=IDS[:, :-1].tolist(), ids=IDS.tolist())
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "native operators not used" in result.stderr
    assert torch.equal(torch.tensor(json.loads(result.stdout.strip().splitlines()[-1])), expected)
