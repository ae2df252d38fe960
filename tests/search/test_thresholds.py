"""Threshold calibration on the tiny pair, with a perfect slim verifier (routing=none)."""

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from viasd_adapters.cli import CONFIG_DIR
from viasd_adapters.cli.calibrate import run
from viasd_adapters.search.thresholds import ThresholdResult, choose


def result(tau, agreement, full):
    return ThresholdResult(tau, tau, agreement, 0.0, full, 0.0, 1.0)


def test_choose_cheapest_setting_that_meets_the_target():
    results = [result(0.99, 1.0, 0.5), result(0.9, 0.985, 0.3), result(0.6, 0.9, 0.1)]
    best, met = choose(results, 0.98)
    assert met and best.tau_accept == 0.9
    best, met = choose(results, 0.999999)
    assert met and best.tau_accept == 0.99
    best, met = choose([result(0.6, 0.9, 0.1), result(0.8, 0.95, 0.2)], 0.98)
    assert not met and best.tau_accept == 0.8


def test_calibrate_end_to_end_on_the_tiny_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    overrides = [
        "model_pair=tiny-random",
        "routing=none",
        "runtime.weights=float32",
        "max_new_tokens=12",
        "grid=[[0.99,0.99],[0.0,0.0]]",
        f"out_dir={tmp_path}/run",
        "output_name=tiny-calibrated",
        "prompts.sources.0.num_prompts=2",
        "progress=false",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="calibrate", overrides=overrides)
    shipped = {p: p.read_bytes() for p in Path(CONFIG_DIR).rglob("*.yaml")}
    out = run(cfg)
    best, results = out.best, out.results
    # routing=none: u == q, so every setting is lossless and the loosest is the cheapest
    assert [r.agreement for r in results] == [1.0, 1.0]
    assert best.tau_accept == 0.0 and results[1].full_calls_per_token < results[0].full_calls_per_token
    assert out.path == tmp_path / "run" / "policy.yaml"
    assert out.installed == tmp_path / "user" / "policy" / "tiny-calibrated.yaml"
    assert out.override == "policy=tiny-calibrated"
    for path in (out.path, out.installed):
        written = yaml.safe_load(Path(path).read_text())
        assert written["tau_accept"] == 0.0 and written["_target_"].endswith("ConfidencePolicy")
    # The package's configs are untouched (the pair's default policy included) ...
    assert {p: p.read_bytes() for p in Path(CONFIG_DIR).rglob("*.yaml")} == shipped
    # ... and the printed override selects the written policy.
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        chosen = compose(config_name="generate", overrides=["model_pair=tiny-random", out.override])
    assert (chosen.policy.tau_accept, chosen.policy.tau_slim) == (0.0, 0.0)


def test_calibrate_over_masks_picks_the_cheapest_point_that_keeps_quality(tmp_path, monkeypatch):
    from viasd_adapters.search.thresholds import verify_cost

    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    (tmp_path / "user" / "routing").mkdir(parents=True)  # a mask of the user's, beside the package's
    (tmp_path / "user" / "routing" / "tiny-2l.yaml").write_text(
        "_target_: viasd_adapters.routing.RoutingMask\n_convert_: all\nmodel: tiny-random\nnum_layers: 4\n"
        "skip_layers: [1, 2]\n"
    )
    overrides = [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "max_new_tokens=12",
        "masks=[tiny-random-1l,tiny-2l]",
        "grid=[[0.99,0.99],[0.0,0.0]]",
        f"out_dir={tmp_path}/run",
        "output_name=tiny-point",
        "prompts.sources.0.num_prompts=2",
        "progress=false",
        "target_agreement=0.98",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="calibrate", overrides=overrides)
    out = run(cfg)
    assert [(r.mask, r.tau_accept) for r in out.results] == [
        ("tiny-random-1l", 0.99),
        ("tiny-random-1l", 0.0),
        ("tiny-2l", 0.99),
        ("tiny-2l", 0.0),
    ]
    assert all(0 < r.slim_cost for r in out.results)  # measured per mask
    meeting = [r for r in out.results if r.agreement >= 0.98]
    assert out.best in meeting and verify_cost(out.best) == min(verify_cost(r) for r in meeting)
    assert out.override == f"routing={out.best.mask} policy=tiny-point"
    assert yaml.safe_load(out.installed.read_text())["tau_accept"] == out.best.tau_accept
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        chosen = compose(config_name="generate", overrides=["model_pair=tiny-random", *out.override.split()])
    assert chosen.policy.tau_accept == out.best.tau_accept


def test_calibrate_stops_before_loading_on_a_missing_prompt_file_or_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    for override, message in [
        (f"prompts.sources.0.path={tmp_path}/nope.jsonl", r"set prompts\.sources\.0\.path=PATH"),
        ("output_name=default", "shipped with the package"),
        ("routing_file=/nonexistent/mask.yaml", "routing_file=/nonexistent/mask.yaml: no such file"),
        ("masks=[qwen2.5-coder-1.5b-4l,no-such-mask]", "no routing mask 'no-such-mask': give a mask YAML file"),
    ]:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="calibrate", overrides=["model_pair=qwen2.5-coder-0.5b-1.5b", override])
        with pytest.raises(ValueError, match=message):
            run(cfg)  # the Qwen pair would take minutes to load: these fail at once


def test_calibrate_by_task_metric_on_the_tiny_pair(tmp_path, monkeypatch):
    """quality=task: the package's scored prompts, each metric's drop against the tiers-off
    output bounded; with a perfect slim verifier every setting keeps quality, the loosest wins."""
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    overrides = [
        "model_pair=tiny-random",
        "routing=none",
        "runtime.weights=float32",
        "quality=task",
        "task.categories=[math_reasoning,translation]",  # the package's summaries overflow the tiny model's context
        "task.limit=2",
        "task.max_new_tokens=8",
        "grid=[[0.99,0.99],[0.0,0.0]]",
        f"out_dir={tmp_path}/run",
        "output_name=tiny-task",
        "progress=false",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="calibrate", overrides=[*overrides, "+task@evaluation=humaneval"])
    out = run(cfg)
    assert set(out.best.drop_bounds) == {"math_reasoning/math_accuracy", "translation/bleu"}
    assert all(bound == 0.0 for r in out.results for bound in r.drop_bounds.values())  # u = q: identical outputs
    assert out.best.tau_accept == 0.0
    assert "every task metric''s paired drop" in out.path.read_text()  # YAML's quoting, in the header
    # The package's math prompts as the evaluation split: refused before the pair loads, naming the fix
    evaluation = ["+task@evaluation=spec_bench", "evaluation.categories=[math_reasoning]", "evaluation.limit=null"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="calibrate", overrides=["model_pair=qwen2.5-coder-0.5b-1.5b", *overrides, *evaluation]
        )
    with pytest.raises(ValueError, match="prompt.s. of task are also in evaluation .* must be disjoint"):
        run(cfg)


def test_task_quality_keeps_a_setting_only_within_every_margin():
    from viasd_adapters.bench.tasks import Prompt
    from viasd_adapters.search.thresholds import TaskQuality

    prompts = [Prompt(str(i), "math", "q", reference="#### 1") for i in range(20)]
    quality = TaskQuality(prompts, {"math": "math_accuracy"}, {"math_accuracy": 0.05}, lambda tokens: str(tokens[0]))
    right, wrong = [1], [2]
    reference = [right] * 20
    assert quality.drop_bounds([right] * 20, reference) == {"math/math_accuracy": 0.0}
    lossy = [wrong] * 4 + [right] * 16  # 4 of 20 answers lost: a 20-point drop
    bounds = quality.drop_bounds(lossy, reference)
    assert bounds["math/math_accuracy"] > 0.2 and quality.excess(bounds) > 0
    cheap = ThresholdResult(0.5, 0.5, 0.9, 0.0, 0.1, 0.0, 1.0, drop_bounds=bounds)
    safe = ThresholdResult(0.9, 0.9, 1.0, 1.0, 0.3, 0.0, 1.0, drop_bounds={"math/math_accuracy": 0.0})
    assert choose([cheap, safe], 0.98, quality) == (safe, True)
    assert choose([cheap], 0.98, quality) == (cheap, False)  # none kept: the most faithful, flagged
    with pytest.raises(ValueError, match=r"no margin for \['math_accuracy'\]"):
        TaskQuality(prompts, {"math": "math_accuracy"}, {}, str)
    with pytest.raises(ValueError, match="no calibration prompt has a task metric"):
        TaskQuality(prompts, {}, {}, str)


def test_split_disjointness_is_checked_by_text():
    from viasd_adapters.bench.splits import check_disjoint

    check_disjoint(["a b", "c"], ["d"], str, "calibration", "evaluation")
    with pytest.raises(ValueError, match="1 prompt.s. of calibration are also in evaluation .'A  b'"):
        check_disjoint(["A  b", "c"], ["a b\n"], str, "calibration", "evaluation")
