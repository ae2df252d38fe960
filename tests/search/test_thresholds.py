"""Threshold calibration on the tiny pair, with a perfect slim verifier (routing=none)."""

from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir

from viasd_adapters.cli import CONFIG_DIR
from viasd_adapters.cli.calibrate import run
from viasd_adapters.search.thresholds import ThresholdResult, choose, select_policy_in_pair_config


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


def test_pair_config_policy_line_is_rewritten(tmp_path):
    pair = tmp_path / "pair.yaml"
    pair.write_text("defaults:\n  - /policy@_global_.policy: default  # thresholds\nname: x\n")
    assert select_policy_in_pair_config(pair, "x-calibrated")
    assert "- /policy@_global_.policy: x-calibrated  # thresholds" in pair.read_text()
    (tmp_path / "other.yaml").write_text("name: y\n")
    assert not select_policy_in_pair_config(tmp_path / "other.yaml", "z")


def test_calibrate_end_to_end_on_the_tiny_pair(tmp_path):
    overrides = [
        "model_pair=tiny-random", "routing=none", "runtime.dtype=float32", "max_new_tokens=12",
        "grid=[[0.99,0.99],[0.0,0.0]]", f"policy_dir={tmp_path}", "select_in_pair_config=false",
        "prompts.sources=[{kind: humaneval, num_prompts: 1}]", "progress=false",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="calibrate", overrides=overrides)
    best, results, path = run(cfg)
    # routing=none: u == q, so every setting is lossless and the loosest is the cheapest
    assert [r.agreement for r in results] == [1.0, 1.0]
    assert best.tau_accept == 0.0 and results[1].full_calls_per_token < results[0].full_calls_per_token
    written = yaml.safe_load(Path(path).read_text())
    assert written["tau_accept"] == 0.0 and written["_target_"].endswith("ConfidencePolicy")
