"""Bad settings fail before any model loads, with a message that names the fix (viasd_adapters.checks)."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from viasd_adapters.checks import check_config
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.sampling import Sampler, SamplingConfig


def composed(config: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config, overrides=overrides)


BAD = [  # (command, overrides, what the error must say)
    ("generate", ["max_new_tokens=0"], "max_new_tokens must be a whole number >= 1"),
    ("generate", ["max_new_tokens=abc"], "max_new_tokens must be a whole number >= 1, got 'abc'"),
    ("generate", ["max_new_tokens=2.5"], "max_new_tokens must be a whole number"),
    ("generate", ["sampling.temperature=-1"], "temperature must be >= 0"),
    ("generate", ["sampling.temperature=nan"], "temperature must be a finite number"),
    ("generate", ["sampling.temperature=hot"], "temperature must be a finite number"),
    ("generate", ["sampling.temperature=1e-40"], "so small that logits / temperature overflow"),
    ("generate", ["sampling.top_p=0"], r"top_p must be in \(0, 1\]"),
    ("generate", ["sampling.top_k=2.5"], "top_k must be a whole number"),
    ("generate", ["sampling.seed=-3"], "seed must be a whole number >= 0"),
    ("generate", ["prompt=' '"], "prompt is empty"),
    ("generate", ["runtime.weights=float64"], "runtime.weights=float64 is not one of float32, bfloat16, float16, int8"),
    ("generate", ["runtime.draft_weights=int4"], "runtime.draft_weights=int4 is not one of"),
    ("generate", ["runtime.activations=int8"], "runtime.weights=float32 with runtime.activations=int8: a float model"),
    (
        "generate",
        ["runtime.draft_activations=float32"],
        "set runtime.draft_activations=null, or runtime.draft_weights=int8",
    ),
    ("generate", ["runtime.weights=int8", "runtime.device=meta"], "runtime.weights=int8: its kernels .* CPUs only"),
    ("generate", ["runtime.device=gpu"], "is not a torch device"),
    ("generate", ["runtime.compile=sometimes"], "runtime.compile='sometimes': use true, false or auto"),
    (
        "generate",
        ["framework=ar", "verifier=tiered"],
        "framework=ar .* takes no verifier.*framework=sd verifier=tiered",
    ),
    (
        "generate",
        ["verifier=full", "policy.tau_accept=0.5"],
        "no decoder of this run reads the policy.*verifier=tiered",
    ),
    ("generate", ["framework=ar", "policy=default"], "no decoder of this run reads the policy"),
    ("generate", ["verifier=full", "routing=qwen2.5-coder-1.5b-2l"], "no decoder of this run reads the routing"),
    ("generate", ["verifier=tiered", "verifier.policy=null", "policy.tau_slim=0.5"], "tiers are off"),
    ("generate", ["verifier=tiered", "routing=none"], "skips no layer.*write routing=qwen2.5-coder-1.5b-4l "),
    ("generate", ["model_pair=smollm2-135m", "verifier=tiered", "routing=none"], "write routing=smollm2-135m-2l "),
    ("generate", ["verifier=tiered", "policy.tau_accept=1.5"], r"tau_accept must be in \[0, 1\]"),
    ("generate", ["verifier=tiered", "verifier.max_unverified=-1"], "max_unverified must be >= 0"),
    ("generate", ["framework.decoder.num_draft_tokens=0"], "num_draft_tokens must be >= 1"),
    ("generate", ["framework.decoder.num_draft_tokens=x"], "num_draft_tokens must be int"),
    ("generate", ["+framework.decoder.windows=3"], "takes no setting 'windows'"),
    ("generate", ["framework=pearl", "framework.decoder.start_method=fork-server"], "start_method must be one of"),
    ("generate", ["framework=pearl", "framework.decoder.window_size=0"], "window_size must be >= 1"),
    ("generate", ["framework=pearl", "framework.decoder.backend=gpu"], "backend must be one of"),
    ("generate", ["framework=lookup", "framework.drafter.min_ngram=0"], "min_ngram"),
    ("generate", ["verifier=faster-cascade", "verifier.alpha=-1"], "alpha must be >= 0"),
    (
        "generate",
        ["model_pair=tiny-random", "framework=llama-cpp"],
        "only the offline zoo models install one; 'tiny-random' is not",
    ),
    ("generate", ["framework=llama-cpp", "framework.decoder.n_ctx=0"], "n_ctx must be >= 1"),
    ("generate", ["framework=llama-cpp", "verifier=tiered"], "framework=llama-cpp .* takes no verifier"),
    (
        "generate",
        ["runtime.draft_weights=int8", "framework=sd-fast"],
        "int8 linear layers already.*framework.drafter.quantize=null",
    ),
    (
        "bench",
        ["runtime.draft_weights=int8", "method=[ar,sd-int8]"],
        "method.sd-int8.framework.drafter.quantize=int8-weight has nothing",
    ),
    (
        "bench",
        ["runtime.draft_weights=bfloat16", "method=[ar,sd-int4]"],
        "method.sd-int4.framework.drafter.quantize=int4 makes 4-bit steps .* set runtime.draft_weights=int8",
    ),
    ("bench", ["repetitions=0"], "repetitions must be a whole number >= 1"),
    ("bench", ["method=[ar,tiered]", "routing=none"], "tiered: the routing mask skips no layer"),
    ("bench", ["method=[ar,sd]", "policy.tau_accept=0.5"], "no decoder of this run reads the policy"),
    ("search", ["runtime.threads=0"], "runtime.threads must be a whole number >= 1"),
]


@pytest.mark.parametrize("command, overrides, message", BAD, ids=[" ".join(o) for _, o, _ in BAD])
def test_bad_setting_is_refused_with_the_fix(command, overrides, message):
    with pytest.raises(ValueError, match=message):
        check_config(composed(command, overrides), overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["framework=ar"],
        ["verifier=tiered"],
        ["verifier=tiered", "policy.tau_accept=0.5"],
        ["verifier=tiered", "verifier.policy=null"],
        ["framework=pearl", "verifier=tiered", "routing=qwen2.5-coder-1.5b-2l"],
        ["framework=lookup", "verifier=tiered-intermediate"],
        ["framework=cascade", "verifier=faster-cascade"],
        ["model_pair=smollm2-135m", "framework=eagle"],
        ["sampling.temperature=0.7", "sampling.top_k=40", "sampling.top_p=0.9"],
    ],
)
def test_good_settings_pass(overrides):
    check_config(composed("generate", overrides), overrides)


@pytest.fixture
def placeholder_profile(tmp_path, monkeypatch):
    """The profile-driven methods (sd-adaptive, auto) need this machine's latency profile to exist; a
    fresh machine has none, so the checks read flat placeholder costs (they check configs, not speed)."""
    import torch

    from viasd_adapters.costs import LatencyEntry, LatencyProfile, default_profile_path, draft_head_key

    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    target = "qwen2.5-coder-1.5b-instruct"
    LatencyProfile(
        entries=[
            LatencyEntry(model, dtype, threads, 256, n, 100.0 + n)
            for model in ("qwen2.5-coder-0.5b-instruct", target, draft_head_key(target, target))
            for dtype in ("float32", "bfloat16", "bfloat16+int8-weight")
            for n in (1, 16)
        ]
    ).save(default_profile_path())


def test_every_shipped_method_passes(placeholder_profile):
    import pathlib

    methods = sorted(p.stem for p in (pathlib.Path(CONFIG_DIR) / "method").glob("*.yaml"))
    if importlib.util.find_spec("llama_cpp") is None:  # an optional extra's method: refused without it (below)
        methods.remove("llama-cpp")
    four_bit = [m for m in methods if m.startswith("sd-int4")]  # 4-bit steps of an int8 draft
    float_draft = [m for m in methods if m not in four_bit]
    check_config(composed("bench", [f"method=[{','.join(float_draft)}]"]), [])
    check_config(composed("bench", ["runtime.draft_weights=int8", f"method=[{','.join(four_bit)}]"]), [])
    # eagle-profiled shapes its tree from the pair's head when checked: a pair without one is refused at once
    with pytest.raises(ValueError, match="eagle-profiled: framework.decoder.tree: no EAGLE head .* train one"):
        check_config(composed("bench", ["model_pair=tiny-random", "method=[eagle-profiled]"]), [])


def test_bad_settings_fail_before_any_model_loads(monkeypatch):
    """On the 1.5B pair: the error comes from the check, not after minutes of loading."""
    import viasd_adapters.models as models
    from viasd_adapters.cli.generate import run

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr("viasd_adapters.pipeline.load_model", load_model)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(composed("generate", ["max_new_tokens=0"]))
    with pytest.raises(ValueError, match="start_method"):
        run(composed("generate", ["framework=pearl", "framework.decoder.start_method=fork-server"]))


def test_a_benchmark_without_its_baseline_fails_before_any_model_loads(monkeypatch, tmp_path):
    import viasd_adapters.models as models
    from viasd_adapters.cli.bench import run

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the methods were checked")

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr("viasd_adapters.pipeline.load_model", load_model)
    with pytest.raises(ValueError, match=r"baseline method 'ar' is not among the methods \['sd'\]: add it"):
        run(composed("bench", ["method=[sd]", f"out_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run").exists()


def _options(group: str) -> list[str]:
    import pathlib

    return sorted(p.stem for p in (pathlib.Path(CONFIG_DIR) / group).glob("*.yaml"))


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_the_refused_framework_verifier_pairs_are_exactly_these(placeholder_profile):
    refused = {}
    for framework in _options("framework"):
        for verifier in _options("verifier"):
            overrides = [f"framework={framework}", f"verifier={verifier}"]
            try:
                check_config(composed("generate", overrides), overrides)
            except ValueError as err:
                refused[framework, verifier] = str(err)
    no_verifier = {
        (framework, verifier)
        for framework in ("ar", "ar-eager", "ar-fbgemm", "llama-cpp")
        for verifier in ("tiered", "tiered-intermediate", "faster-cascade")
    }
    if importlib.util.find_spec("llama_cpp") is None:  # refused with every verifier: the extra is missing
        no_verifier |= {("llama-cpp", "full")}
    assert set(refused) == no_verifier | {("eagle", "tiered-intermediate"), ("eagle", "faster-cascade")}
    assert refused["eagle", "faster-cascade"] == (
        "framework=eagle (EAGLE) runs verifier=full (stock EAGLE) or verifier=tiered (VIA-SD on a routed view of"
        " the target's own layers), not verifier=faster-cascade: pick one of those, or framework=sd or"
        " framework=pearl or framework=auto for verifier=faster-cascade"
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["framework=eagle", "verifier=tiered-intermediate"], "runs verifier=full .* not verifier=tiered-intermediate"),
        (
            ["framework=eagle", "verifier=tiered", "verifier.share_prefix=true"],
            r"^framework=eagle \(EAGLE\) does not honour the verifier's share_prefix: set verifier.share_prefix=false$",
        ),
        (
            [
                "framework=eagle",
                "verifier=tiered",
                "+verifier.gate._target_=viasd_adapters.verify.gate.DraftConfidenceGate",
            ],
            "does not honour the verifier's gate: set verifier.gate=null",
        ),
        (
            ["framework=eagle", "+framework.drafter._target_=viasd_adapters.draft.PromptLookupDrafter"],
            r"framework=eagle \(EAGLE\) drafts for itself: set framework.drafter=null",
        ),
        (
            ["framework=sd", "framework.drafter=null"],
            r"framework=sd \(SD\) drafts with framework.drafter, which is null",
        ),
    ],
    ids=["intermediate", "share-prefix", "gate", "drafter", "no-drafter"],
)
def test_a_framework_its_host_cannot_run_is_refused_before_any_model_loads(monkeypatch, overrides, message):
    """These were refused only after the models had loaded (or, for a drafter, ignored)."""
    import viasd_adapters.models as models
    from viasd_adapters.cli.generate import run

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the pair was checked")

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr("viasd_adapters.pipeline.load_model", load_model)
    with pytest.raises(ValueError, match=message):
        run(composed("generate", ["model_pair=smollm2-135m", *overrides]))


def test_the_console_script_reads_its_overrides(tmp_path):
    """`@hydra.main` passes the command line to the check: an unused policy override is refused."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "viasd_adapters.cli.generate",
            "model_pair=tiny-random",
            "verifier=full",
            "max_new_tokens=4",
            "policy.tau_accept=0.5",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},  # this checkout, not an installed copy
    )
    assert out.returncode != 0 and "no decoder of this run reads the policy" in out.stderr


def test_a_temperature_that_overflows_these_logits_is_a_clear_error():
    sampler = Sampler(SamplingConfig(temperature=1e-29))
    with pytest.raises(ValueError, match="too small for these logits"):
        sampler.probs(torch.tensor([1e10, 0.0, -5.0]))
    assert sampler.probs(torch.tensor([3.0, 0.0, float("-inf")]))[0] == 1.0  # masked logits are fine


def test_the_llama_cpp_method_without_its_extra_is_refused_with_the_install_command(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else find_spec(name, *a)
    )
    with pytest.raises(ValueError, match=r"needs llama-cpp-python: pip install 'viasd-adapters\[llama-cpp\]'"):
        check_config(composed("bench", ["method=[ar,llama-cpp]"]), [])


def test_4_bit_draft_steps_on_a_cpu_without_their_kernel_are_refused(monkeypatch):
    from viasd_adapters.models import native

    overrides = ["runtime.draft_weights=int8", "method=[ar,sd-int4]"]
    check_config(composed("bench", overrides), overrides)
    monkeypatch.setattr(native, "cpu_unsupported", lambda: "an aarch64 CPU, not x86-64")
    with pytest.raises(ValueError, match="needs an x86-64 CPU with AVX2 \\(an aarch64 CPU.*quantize=null"):
        check_config(composed("bench", overrides), overrides)
