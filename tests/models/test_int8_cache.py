"""The int8 cache (`models.int8_cache`): a cached load is bitwise the freshly quantised model and
reads no float weight; stale, corrupt, incomplete or unwritable caches are remade or skipped,
never trusted."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.conftest import tiny
from viasd_adapters.models import ModelSpec, int8_cache, load_model, quantize
from viasd_adapters.models.int8_cache import cache_path
from viasd_adapters.models.quantize import Int8Linear

IDS = torch.tensor([[5, 17, 99, 3, 42, 7, 64, 11]])


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A tiny fp32 model saved as a transformers folder, with the project's cache in tmp_path."""
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path / "cache"))
    loaded = tiny(seed=0)
    loaded.model.save_pretrained(tmp_path / "model")
    loaded.tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


@torch.no_grad()
def int8_logits(folder) -> torch.Tensor:
    model = load_model(ModelSpec(name=str(folder), weights="int8")).model
    assert any(m.channels is not None for m in model.modules() if isinstance(m, Int8Linear))  # outlier groups used
    return model(IDS).logits


def refuse(*_, **__):
    raise AssertionError("a cached load must neither calibrate nor quantise")


def test_a_cached_load_is_bitwise_the_quantised_model_and_reads_no_float_weight(folder, monkeypatch):
    quantised = int8_logits(folder)
    assert cache_path(folder).exists()
    monkeypatch.setattr(int8_cache, "calibrate_outliers", refuse)
    monkeypatch.setattr(quantize, "_quantize_per_channel", refuse)
    assert torch.equal(int8_logits(folder), quantised)


def test_a_cache_of_other_files_is_remade(folder, monkeypatch, caplog):
    quantised = int8_logits(folder)
    config = folder / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # the folder changed
    with caplog.at_level(logging.INFO):
        assert torch.equal(int8_logits(folder), quantised)
    assert "made from other files" in caplog.text and "cached in" in caplog.text
    monkeypatch.setattr(int8_cache, "calibrate_outliers", refuse)  # the remade file is used next
    int8_logits(folder)


def test_a_corrupt_cache_is_remade(folder, caplog):
    quantised = int8_logits(folder)
    path = cache_path(folder)
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    assert torch.equal(int8_logits(folder), quantised)
    assert "unreadable" in caplog.text
    with safe_open(str(path), "pt") as f:  # rewritten whole
        assert json.loads(f.metadata()["key"]) == int8_cache.cache_key(folder)


def test_an_incomplete_cache_is_filled_from_the_checkpoint_and_removed(folder, caplog):
    quantised = int8_logits(folder)
    path = cache_path(folder)
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        kept = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("lm_head.")}
    save_file(kept, str(path), metadata=metadata)
    assert torch.equal(int8_logits(folder), quantised)
    assert "lacked 1 of the weights" in caplog.text and not path.exists()


def test_an_unwritable_cache_only_warns(folder, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("VIASD_CACHE", str(blocker))  # mkdir under a file fails
    int8_logits(folder)
    assert "could not write the cache of int8 weights" in caplog.text


def test_tiny_and_hub_models_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    load_model(ModelSpec(name="tiny-random", weights="int8"))
    assert not (tmp_path / "int8").exists()
