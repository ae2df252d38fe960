"""Every config group composes and instantiates (lightning-hydra-template's test_configs)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from viasd_adapters.models import ModelSpec

CONF = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_generate(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="generate", overrides=list(overrides))


def test_groups_are_not_empty():
    assert {"qwen2.5-coder-0.5b-1.5b", "smollm2-135m", "tiny-random"} <= set(options("model_pair"))
    assert {"ar", "sd"} <= set(options("framework"))
    assert "full" in options("verifier")


@pytest.mark.parametrize("pair", options("model_pair"))
def test_model_pairs_instantiate_specs(pair):
    cfg = compose_generate(f"model_pair={pair}", "runtime.dtype=float16")
    target, draft = (instantiate(cfg.model_pair[role]) for role in ("target", "draft"))
    assert isinstance(target, ModelSpec) and isinstance(draft, ModelSpec)
    assert target.dtype == "float16"


@pytest.mark.parametrize("framework", options("framework"))
@pytest.mark.parametrize("verifier", options("verifier"))
def test_frameworks_and_verifiers_compose(framework, verifier):
    cfg = compose_generate(f"framework={framework}", f"verifier={verifier}")
    assert cfg.framework.name == framework
    assert "_target_" in cfg.framework.decoder and "_target_" in cfg.verifier
    assert instantiate(cfg.sampling).greedy
