"""EAGLE head training streamed from feature shards: resumed runs continue bitwise, the
distribution term can score a draft vocabulary, held-out sequences are never trained on."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny
from tests.train.test_shards import CHATML, sharegpt_file
from viasd_adapters.models.vocab import DraftVocabulary
from viasd_adapters.train import eagle, shards

pytest.importorskip("eagle.model.cnets")


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """(target, shard folder, manifest) of the hand-written conversations, 2 sequences a shard."""
    root = tmp_path_factory.mktemp("stream")
    loaded = tiny(seed=0, max_position_embeddings=1024)
    loaded.tokenizer.chat_template = CHATML
    cfg = shards.CorpusConfig(
        self_distill=False,
        sharegpt=True,
        sharegpt_path=str(sharegpt_file(root / "s.json")),
        max_seq_len=128,
        eval_fraction=0.2,
        sequences_per_shard=2,
    )
    _, manifest = shards.run_features(loaded, cfg, root / "f", progress=False)
    return loaded, root / "f", manifest


def _head_config(loaded):
    from viasd_adapters.third_party.eagle import head_config

    return head_config(loaded.model.config, intermediate_size=32)


def _train(features, out, steps, **kw):
    loaded, folder, manifest = features
    cfg = eagle.TrainConfig(steps=steps, batch_tokens=40, save_every=2, eval_every=3, warmup_steps=2, **kw)
    return eagle.train_head(loaded, folder, manifest, _head_config(loaded), cfg, out, progress=False)


def test_the_stream_visits_every_training_sequence_once_an_epoch_in_a_seeded_order(features):
    _, folder, manifest = features
    stream = eagle.ShardStream(folder, manifest, "train", seed=0)
    first = [s["id"] for s in stream.epoch(0)]
    assert sorted(first) == sorted(
        s["id"] for p in stream.paths for s in shards.shard_sequences(torch.load(p, weights_only=False))
    )
    assert len(set(first)) == len(first) == len(stream)
    assert [s["id"] for s in stream.epoch(0)] == first
    assert [s["id"] for s in stream.epoch(1)] != first
    assert [s["id"] for s in stream.epoch(0, skip=3)] == first[3:]
    held = {s["id"] for s in eagle.ShardStream(folder, manifest, "heldout", seed=0).all()}
    assert held and not held & set(first)


def test_a_resumed_training_run_ends_where_an_uncut_one_does(features, tmp_path, monkeypatch):
    uncut = tmp_path / "uncut"
    uncut.mkdir()
    head, steps, top1, _, history = _train(features, uncut, 6)
    cut = tmp_path / "cut"
    cut.mkdir()
    save = eagle._atomic_save

    def killed_after_step_4(obj, path):
        save(obj, path)
        if obj["step"] == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(eagle, "_atomic_save", killed_after_step_4)
    with pytest.raises(KeyboardInterrupt):
        _train(features, cut, 6)
    monkeypatch.setattr(eagle, "_atomic_save", save)
    resumed, steps2, top1_2, _, history2 = _train(features, cut, 6)
    assert steps == steps2 == 6 and [h["step"] for h in history2] == list(range(1, 7))
    assert history2 == history and top1_2 == top1
    for (name, a), (_, b) in zip(head.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert history[-1]["epoch"] >= 1  # the run crossed an epoch boundary


def test_the_distribution_term_scores_only_the_draft_vocabulary(features, tmp_path):
    loaded, _, _ = features
    vocab = DraftVocabulary(list(range(0, 257, 2)), 257)  # every second id
    path = vocab.save(tmp_path / "v.json")
    rows, ids = eagle._distribution_rows(loaded.model, eagle.TrainConfig(p_vocab=str(path)))
    assert torch.equal(ids, torch.tensor(vocab.token_ids))
    assert torch.equal(rows, loaded.model.get_output_embeddings().weight[ids].float())
    out = tmp_path / "out"
    out.mkdir()
    _, steps, top1, _, _ = _train(features, out, 2, p_vocab=str(path))
    assert steps == 2 and 0.0 <= top1 <= 1.0
    with pytest.raises(ValueError, match="built for 300 ids"):
        eagle._distribution_rows(
            loaded.model, eagle.TrainConfig(p_vocab=str(DraftVocabulary([1], 300).save(tmp_path / "w.json")))
        )


def test_trained_positions_are_those_whose_next_next_token_is_an_answer():
    mask = torch.tensor([0, 0, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    # position t regresses f_{t+1}, which scores x_{t+2}; the last one (t = 7) where x_8 is an answer
    assert eagle.position_mask(mask).tolist() == [False, True, True, False, False, True, True, True]


def test_the_training_precision_is_checked_and_bf16_only_where_the_cpu_multiplies_it(monkeypatch):
    from viasd_adapters import hardware

    with pytest.raises(ValueError, match="train.precision='fp16'"):
        eagle.TrainConfig(precision="fp16")
    for isa, limits, expected in [
        (("AVX512-BF16", "AVX-512", "AVX2"), (), "bfloat16"),
        (("AMX-BF16", "AVX2"), (), "bfloat16"),
        (("AVX-512", "AVX2"), (), "float32"),
        (("AVX512-BF16", "AVX2"), ("ATEN_CPU_CAPABILITY=avx2",), "float32"),  # an emulated AVX2 CPU
    ]:
        cpu = hardware.CpuInfo("cpu", isa, 2, limits)
        monkeypatch.setattr(hardware, "cpu_info", lambda cpu=cpu: cpu)
        assert eagle.TrainConfig().resolved_precision() == expected
        assert eagle.TrainConfig(precision="bfloat16").resolved_precision() == "bfloat16"
        assert eagle.TrainConfig(precision="float32").resolved_precision() == "float32"
