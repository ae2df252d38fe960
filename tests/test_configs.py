"""Every config group composes and instantiates (lightning-hydra-template's test_configs)."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.models import ModelSpec

CONF = Path(CONFIG_DIR)


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
    cfg = compose_generate(f"model_pair={pair}", "runtime.weights=float16")
    target, draft = (instantiate(cfg.model_pair[role]) for role in ("target", "draft"))
    assert isinstance(target, ModelSpec) and isinstance(draft, ModelSpec)
    assert target.weights == "float16" and target.precision.torch_dtype == torch.float16


@pytest.mark.parametrize("framework", options("framework"))
@pytest.mark.parametrize("verifier", options("verifier"))
def test_frameworks_and_verifiers_compose(framework, verifier):
    cfg = compose_generate(f"framework={framework}", f"verifier={verifier}")
    assert cfg.framework.name == framework
    assert "_target_" in cfg.framework.decoder and "_target_" in cfg.verifier
    assert instantiate(cfg.sampling).greedy


@pytest.mark.parametrize("routing", options("routing"))
def test_routing_masks_instantiate(routing):
    from viasd_adapters.routing import RoutingMask

    cfg = compose_generate(f"routing={routing}")
    assert isinstance(instantiate(cfg.routing), RoutingMask)


@pytest.mark.parametrize("policy", options("policy"))
def test_policies_instantiate(policy):
    from viasd_adapters.verify import TierPolicy

    cfg = compose_generate(f"policy={policy}")
    assert isinstance(instantiate(cfg.policy), TierPolicy)


@pytest.mark.parametrize(
    "framework", ["ar", "sd", "lookup", "cascade", "sd-confident", "sd-vocab", "sd-int8", "sd-fast", "sd-adaptive-int8"]
)
@pytest.mark.parametrize("verifier", ["full", "tiered", "tiered-intermediate", "faster-cascade"])
def test_decoders_build_and_decode_on_the_tiny_pair(framework, verifier):
    from viasd_adapters.cli.generate import run

    cfg = compose_generate(
        "model_pair=tiny-random", f"framework={framework}", f"verifier={verifier}", "max_new_tokens=6"
    )
    if framework == "ar" and verifier != "full":  # AR verifies nothing: refused, not silently ignored
        with pytest.raises(ValueError, match="takes no verifier"):
            run(cfg)
        return
    _, result = run(cfg)
    assert len(result.tokens) == 6


def test_every_benchmark_method_builds_on_the_tiny_pair(tmp_path, monkeypatch):
    import torch

    from viasd_adapters.costs import LatencyEntry, LatencyProfile, default_profile_path
    from viasd_adapters.decode.schedule import AdaptiveDraftLength
    from viasd_adapters.pipeline import build_decoder, load_pair

    # sd-adaptive reads this machine's latency profile: give it one for the tiny models
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    entries = [LatencyEntry("tiny-random", "bfloat16", threads, 128, n, 10.0 + n) for n in (1, 4, 8)]
    LatencyProfile(entries=entries).save(default_profile_path())
    # EAGLE's methods need a head for the target: tests/hosts/test_eagle.py builds them on this pair;
    # llama.cpp a GGUF, which only offline models ship: tests/bench/test_llama_cpp.py builds it on SmolLM2;
    # 4-bit steps an int8 draft: tests/models/test_int4_gemv.py decodes sd-int4 on this pair in int8
    methods = [m for m in options("method") if not m.startswith(("eagle", "sd-int4")) and m != "llama-cpp"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=["model_pair=tiny-random", f"method=[{','.join(methods)}]"])
    pair = load_pair(cfg.model_pair)
    decoders = {name: build_decoder(m.framework, m.verifier, pair) for name, m in cfg.method.items()}
    assert set(decoders) == set(methods)
    assert isinstance(decoders["sd-adaptive"].draft_length, AdaptiveDraftLength)
    # The random-skipping ablation keeps the pair mask's budget.
    routing, random = instantiate(cfg.routing), decoders["tiered-random"].verifier.slim.model.mask
    assert len(random.skip_layers) == len(routing.skip_layers) and random.provenance["method"].startswith("random")


# ----------------------------------------------------------------------------- the runtime group
COMMANDS = sorted(p.stem for p in CONF.glob("*.yaml"))  # every primary config: one per command
RUNTIME = {k: v for k, v in OmegaConf.load(CONF / "runtime" / "default.yaml").items() if k != "defaults"}


def compose_command(command: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=command, overrides=list(overrides))


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_the_one_runtime_group(command):
    """Every command composes conf/runtime/default.yaml; its own file overrides only keys the group
    has (with a comment), and no command keeps a top-level `threads` of its own."""
    cfg = compose_command(command)
    assert set(cfg.runtime) == set(RUNTIME), f"{command}: runtime keys {sorted(cfg.runtime)}"
    assert "threads" not in cfg
    own = OmegaConf.load(CONF / f"{command}.yaml")
    assert set(own.get("runtime") or {}) <= set(RUNTIME)
    assert compose_command(command, "runtime.threads=3").runtime.threads == 3


@pytest.mark.parametrize(
    "override, key",
    [
        ("runtime.threads=two", "runtime.threads"),
        ("runtime.device=[cpu]", "runtime.device"),
        ("policy.tau_accept=high", "policy.tau_accept"),
        ("framework.name=[sd]", "framework.name"),
        ("verifier=tiered verifier.max_unverified=many", "verifier.max_unverified"),
        ("verifier=tiered verifier.rejudge=maybe", "verifier.rejudge"),
    ],
)
def test_a_mistyped_config_value_fails_while_composing_naming_it(override, key):
    """The groups' typed schemas (schema.py) catch these before any config is instantiated: without
    them Hydra would compose all six and the mistake would surface later or never."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as caught:
        compose_generate(*override.split())
    assert key in str(caught.value) + str(caught.value.__cause__)


def test_commands_differ_from_the_runtime_defaults_only_where_they_say_why():
    differing = {c: {k: v for k, v in compose_command(c).runtime.items() if v != RUNTIME[k]} for c in COMMANDS}
    assert {c: d for c, d in differing.items() if d} == {
        "frontier": {"weights": "float32", "threads": 2},  # agreement measures lossy tiers only; equal cores
        "generate": {"weights": "float32"},  # greedy SD token-identical to greedy AR
        "train_eagle": {"weights": "float32"},  # the target's features, as the head is trained on them
    }


def test_the_old_threads_key_fails_naming_the_new_one(monkeypatch):
    import sys

    from viasd_adapters.checks import check_config
    from viasd_adapters.cli.generate import main

    with pytest.raises(ValueError, match=r"^threads= is now runtime.threads= .*: write runtime.threads=2$"):
        check_config(compose_generate("+threads=2"), ["+threads=2"])
    with pytest.raises(ValueError, match="the config sets threads, which is now runtime.threads"):
        check_config(compose_generate("+threads=2"), [])
    monkeypatch.setattr(sys, "argv", ["viasd-generate", "model_pair=tiny-random", "threads=2"])
    with pytest.raises(ValueError, match="write runtime.threads=2"):  # before Hydra, which would not name it
        main()


@pytest.mark.parametrize(
    "old, new", [("runtime.dtype", "runtime.weights"), ("runtime.draft_dtype", "runtime.draft_weights")]
)
def test_the_old_dtype_keys_fail_naming_weights_and_activations(monkeypatch, old, new):
    import sys

    from viasd_adapters.cli.generate import main

    monkeypatch.setattr(sys, "argv", ["viasd-generate", "model_pair=tiny-random", f"{old}=int8"])
    with pytest.raises(ValueError, match=f"^{old}= is now {new}= \\(precision is two settings now, weights and"):
        main()


def test_a_calibrated_policy_file_is_a_policy_option_and_a_policy_path(tmp_path, monkeypatch):
    """viasd-calibrate's file extends the policy schema: Hydra composes it as `policy=NAME` from the
    user config directory, and the Python API reads the same file by path."""
    from viasd_adapters.api import tier_policy
    from viasd_adapters.search.thresholds import ThresholdResult, write_policy
    from viasd_adapters.verify import ConfidencePolicy

    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path))
    best = ThresholdResult(0.7, 0.6, agreement=0.99, exact_rate=0.9, full_calls_per_token=0.2,
                           slim_calls_per_token=0.3, tokens_per_second=5.0)  # fmt: skip
    path = write_policy(
        tmp_path / "policy" / "mine.yaml", best, True, "agreement >= 0.98", {"model_pair": "tiny-random"}
    )
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="generate", overrides=[f"hydra.searchpath=[file://{tmp_path}]", "policy=mine"])
    assert instantiate(cfg.policy) == ConfidencePolicy(tau_accept=0.7, tau_draft=0.0, tau_slim=0.6)
    assert tier_policy(path) == ConfidencePolicy(tau_accept=0.7, tau_draft=0.0, tau_slim=0.6)
