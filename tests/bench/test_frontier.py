"""The frontier sweep: points from the config, summaries, matched quality, and a run on the tiny pair."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from viasd_adapters.bench.frontier import (
    CASCADE_SD,
    FASTER_CASCADES,
    Point,
    PointSummary,
    SweepConfig,
    build_points,
    mask_labels,
    matched_comparison,
    matches_quality,
    quality_gaps,
    summarize,
)
from viasd_adapters.configs import CONFIG_DIR, load_routing

CONF = Path(CONFIG_DIR)
PROMPTS = [
    {
        "question_id": 1,
        "category": "translation",
        "turns": ["Translate German to English: Guten Morgen"],
        "reference": ["Good morning"],
    },
    {"question_id": 3, "category": "math_reasoning", "turns": ["What is 2 + 3?"], "reference": ["2 + 3 = 5\n#### 5"]},
    {"question_id": 4, "category": "qa", "turns": ["Who wrote Faust?"]},
]


def compose_frontier(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="frontier", overrides=["out_dir=unused", *overrides])


def test_shipped_config_composes_and_every_point_builds_its_config():
    cfg = compose_frontier()
    sweep = instantiate(cfg.sweep, _convert_="all")
    points = build_points(sweep, cfg.method, load_routing(sweep.masks))
    names = [p.name for p in points]
    assert names[:2] == ["ar", "sd-adaptive-int8"]  # the host is the fastest lossless SD configuration
    n_masks, n_thr = len(sweep.masks), len(sweep.thresholds)
    assert sum(p.kind == "via-sd" for p in points) == n_masks * n_thr
    assert sum(p.kind == "random" for p in points) == len(sweep.random_masks or sweep.masks)
    assert sum(p.kind == "faster-cascade" for p in points) == len(sweep.alphas)
    assert {t["name"] for t in cfg.tasks.values()} == {"math", "text", "humaneval"}


def test_via_sd_and_faster_cascades_run_on_the_host_the_references_name():
    """The int8 frontier's host is sd-confident: the slim tier must be measured on it, not on
    the framework the VIA-SD method file happens to carry (sd-adaptive-int8)."""
    cfg = compose_frontier(
        "method=[ar,sd-confident,tiered-fast,faster-cascade-fast]",
        "sweep.references=[ar,sd-confident]",
        "sweep.masks=[qwen2.5-coder-1.5b-4l]",
        "sweep.thresholds=[[0.9,0.9]]",
        "sweep.random_masks=null",
        "sweep.random_thresholds=null",
        "sweep.alphas=[0.5]",
        "sweep.cascade=null",
        "sweep.intermediate=null",
        "sweep.gated=[]",
    )
    sweep = instantiate(cfg.sweep, _convert_="all")
    points = {p.name: p for p in build_points(sweep, cfg.method, load_routing(sweep.masks))}
    host = points["sd-confident"].framework
    assert host.name == "sd-confident" and cfg.method["tiered-fast"].framework.name != "sd-confident"
    for name in ("via-sd[4l]@0.9/0.9", "faster-cascade@0.5"):
        assert points[name].framework == host
    assert points["via-sd[4l]@0.9/0.9"].verifier.share_prefix  # the verifier is still tiered-fast's
    assert points["faster-cascade@0.5"].verifier.alpha == 0.5


def test_points_carry_their_mask_thresholds_and_alpha():
    cfg = compose_frontier(
        "model_pair=tiny-random",
        "sweep.masks=[tiny-random-1l]",
        "sweep.random_masks=null",
        "sweep.gated=[]",
        "sweep.thresholds=[[0.5,0.3],[0.9,0.8]]",
        "sweep.alphas=[0.0,2.0]",
        "sweep.random_thresholds=[0.7,0.6]",
    )
    sweep = instantiate(cfg.sweep, _convert_="all")
    points = {p.name: p for p in build_points(sweep, cfg.method, load_routing(sweep.masks), attention_share=0.25)}
    via = points["via-sd[1l]@0.9/0.8"]
    assert (via.verifier.policy.tau_accept, via.verifier.policy.tau_slim) == (0.9, 0.8)
    assert list(via.verifier.slim.mask.skip_layers) == [2] and via.verifier.share_prefix
    assert via.slim_layers == 3 and via.family == "VIA-SD 1l"
    assert via.full_layers == 2  # share_prefix: an escalation runs layers [2, 4) over the slim pass's states
    random = points["random[1l]@0.7/0.6"]
    assert random.verifier.slim.mask._target_.endswith("random_like") and random.verifier.slim.mask.seed == 0
    assert (random.verifier.policy.tau_accept, random.verifier.policy.tau_slim) == (0.7, 0.6)
    assert points["faster-cascade@2"].verifier.alpha == 2.0 and points["faster-cascade@0"].verifier.alpha == 0.0
    assert points["lookup-intermediate"].slim_layers == "draft"
    mask = instantiate(random.verifier.slim.mask)
    assert len(mask.skip_layers) == 1  # random skipping at the searched mask's budget


def test_mask_labels_drop_the_shared_prefix_and_stay_distinct():
    names = ["qwen2.5-coder-1.5b-4l", "qwen2.5-coder-1.5b-8l-cost", "qwen2.5-coder-1.5b-13l-cost"]
    assert mask_labels(names) == dict(zip(names, ["4l", "8l-cost", "13l-cost"]))
    assert mask_labels(["qwen2.5-coder-1.5b-8l"]) == {"qwen2.5-coder-1.5b-8l": "8l"}
    assert mask_labels(["a-1l", "b-1l"]) == {"a-1l": "a-1l", "b-1l": "b-1l"}  # nothing shared: whole names


def test_bad_sweeps_fail_with_the_fix():
    with pytest.raises(ValueError, match="pairs in"):
        SweepConfig(masks=["m"], thresholds=[[0.5]])
    with pytest.raises(ValueError, match="routing mask"):
        SweepConfig(thresholds=[[0.5, 0.3]])
    with pytest.raises(ValueError, match="alpha"):
        SweepConfig(alphas=[-1.0])
    with pytest.raises(ValueError, match="among the sweep's masks"):
        SweepConfig(masks=["a"], thresholds=[[0.5, 0.3]], random_thresholds=[0.9, 0.9], random_masks=["b"])
    with pytest.raises(ValueError, match="no routing mask 'no-such-mask': give a mask YAML file .*viasd-search"):
        load_routing(["no-such-mask"])
    cfg = compose_frontier("model_pair=tiny-random")
    with pytest.raises(ValueError, match="not composed"):
        build_points(SweepConfig(references=["ar", "pearl"]), cfg.method, {})
    with pytest.raises(ValueError, match="twice"):
        build_points(SweepConfig(alphas=[0.5, 0.5]), cfg.method, {})


def test_a_bad_setting_fails_before_the_models_load(tmp_path, monkeypatch):
    from viasd_adapters.cli import frontier

    monkeypatch.setattr(frontier, "load_pair", lambda *a, **k: pytest.fail("the models loaded"))
    with pytest.raises(ValueError, match="runtime.threads"):
        frontier.run(compose_frontier("model_pair=tiny-random", f"out_dir={tmp_path}", "runtime.threads=0"))


def _rec(method, prompt, drafted, accepted, new, steps, target, slim, speed, match, metric=None, q=None, tiers=None):
    return {
        "method": method,
        "prompt_id": prompt,
        "task": "t",
        "rep": 0,
        "drafted": drafted,
        "accepted": accepted,
        "new_tokens": new,
        "steps": steps,
        "model_calls": {"target": {"calls": target}, "slim": {"calls": slim}},
        "speedup_vs_baseline": speed,
        "speedup_vs_host": speed,
        "token_match_vs_baseline": match,
        "exact_match_vs_baseline": float(match == 1.0),
        "quality_metric": metric,
        "quality": q,
        "tier_counts": tiers or {},
    }


def _point(name, kind="via-sd", family=None, mask=None):
    return Point(name, family or name, kind, None, None, None, mask)


def test_summaries_pool_counts_over_records():
    records = [
        _rec("v", 1, 10, 6, 12, 4, 2, 4, 1.2, 1.0, "bleu", 30.0, {"accept": 6, "full": 2}),
        _rec("v", 2, 30, 24, 28, 6, 4, 6, 0.8, 0.9, "bleu", 20.0, {"accept": 20, "slim": 2}),
    ]
    (s,) = summarize(records, [_point("v", mask="m")], {"m": 0.7})
    assert s.rejection_rate == pytest.approx(1 - 30 / 40)
    assert s.tokens_per_round == pytest.approx(40 / 10)
    assert s.full_per_token == pytest.approx(6 / 40) and s.slim_per_token == pytest.approx(10 / 40)
    assert s.speedup_vs_ar == pytest.approx(1.0) and s.agreement == pytest.approx(0.95) and s.exact == 0.5
    assert s.quality == {"bleu": 25.0} and s.slim_cost == 0.7
    assert s.tier_shares == pytest.approx({"accept": 26 / 30, "full": 2 / 30, "slim": 2 / 30})
    assert s.settled_share is None  # the records do not count settled rounds
    for r, settled in zip(records, (2, 3)):
        r["settled_blocks"] = settled
    (s,) = summarize(records, [_point("v", mask="m")], {"m": 0.7})
    assert s.settled_share == pytest.approx(5 / 10)  # pooled over the 4 + 6 rounds


def _summary(name, kind, family, speed, rejection, agreement, quality):
    return PointSummary(
        name,
        family,
        kind,
        None,
        1,
        rejection,
        2.0,
        0.3,
        0.3,
        None,
        speed,
        speed,
        agreement,
        1.0,
        quality,
        {m: 1 for m in quality},
    )


def test_matched_quality_counts_metrics_in_points():
    ar = _summary("ar", "ar", "AR", 1.0, None, 1.0, {"bleu": 30.0, "rouge_l": 0.30, "math_accuracy": 0.5})
    close = _summary("a", "via-sd", "VIA-SD", 1, 0.2, 0.99, {"bleu": 29.2, "rouge_l": 0.295, "math_accuracy": 0.5})
    assert quality_gaps(close, ar) == pytest.approx({"bleu": -0.8, "rouge_l": -0.5, "math_accuracy": 0.0})
    assert matches_quality(close, ar)
    rouge_drop = _summary("b", "via-sd", "VIA-SD", 1, 0.2, 0.99, {"bleu": 30.0, "rouge_l": 0.28, "math_accuracy": 0.5})
    assert not matches_quality(rouge_drop, ar)  # 2 ROUGE-L points
    disagrees = _summary("c", "via-sd", "VIA-SD", 1, 0.2, 0.97, {"bleu": 31.0})
    assert not matches_quality(disagrees, ar)
    assert matches_quality(_summary("d", "via-sd", "VIA-SD", 1, 0.2, 0.99, {"bleu": 40.0}), ar)  # better is fine


def test_comparison_takes_the_fastest_matched_point_of_each_family():
    q = {"math_accuracy": 0.5}
    summaries = [
        _summary("ar", "ar", "AR", 1.0, None, 1.0, q),
        _summary("sd", "sd", "SD", 0.9, 0.6, 1.0, q),
        _summary("v-fast-lossy", "via-sd", "VIA-SD 8l", 1.5, 0.1, 0.90, q),  # fastest, but not matched
        _summary("v-ok", "via-sd", "VIA-SD 4l", 0.8, 0.5, 0.99, q),
        _summary("v-ok-slow", "via-sd", "VIA-SD 4l", 0.7, 0.4, 1.0, q),
        _summary("fc-lossy", "faster-cascade", FASTER_CASCADES, 1.4, 0.1, 0.5, q),
        _summary("fc-ok", "faster-cascade", FASTER_CASCADES, 0.95, 0.55, 0.985, q),
    ]
    by_rival = {c.rival: c for c in matched_comparison(summaries)}
    fc = by_rival[FASTER_CASCADES]
    assert fc.via_sd.name == "v-ok" and fc.other.name == "fc-ok"
    assert fc.rejection_diff == pytest.approx(0.5 - 0.55) and fc.speed_diff == pytest.approx(0.8 - 0.95)
    assert by_rival[CASCADE_SD].other is None and by_rival[CASCADE_SD].rejection_diff is None
    assert by_rival["SD"].speed_diff == pytest.approx(0.8 - 0.9)


def test_frontier_runs_in_chunks_resumes_and_reports_on_the_tiny_pair(tmp_path):
    from viasd_adapters.cli.frontier import run

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    out = tmp_path / "out"
    overrides = [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "runtime.draft_weights=float32",
        "sweep.masks=[tiny-random-1l]",
        "sweep.random_masks=null",
        "sweep.gated=[]",
        "sweep.thresholds=[[0.5,0.3]]",
        "sweep.alphas=[0.5]",
        "sweep.cascade=null",
        f"tasks.math.prompts_file={prompts}",
        f"tasks.text.prompts_file={prompts}",
        "tasks.text.categories=[translation,qa]",
        "tasks.math.max_new_tokens=6",
        "tasks.text.max_new_tokens=6",
        "~tasks.code",
        "progress=false",
        "profile.context=16",
        "profile.tokens=[1,4]",
        "profile.prefill=[24,32]",
        "profile.repetitions=2",
        "warmup_tokens=2",
        f"out_dir={out}",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        math_only = compose(config_name="frontier", overrides=[*overrides, "only=[math]"])
        one_prompt = compose(config_name="frontier", overrides=[*overrides, "chunk_prompts=1"])
        everything = compose(config_name="frontier", overrides=overrides)
        report = compose(config_name="frontier", overrides=[*overrides, "report_only=true"])
    lines = lambda task: (out / f"records-{task}.jsonl").read_text().splitlines()
    run(math_only)
    points = json.loads((out / "points.json").read_text())
    assert len(lines("math")) == len(points) == 6  # ar, sd-adaptive-int8, via-sd, random, faster-cascade, intermediate
    assert not (out / "records-text.jsonl").exists()
    stamp = (out / "records-math.jsonl").stat().st_mtime_ns
    run(one_prompt)  # math is complete; one of text's two prompts
    assert (out / "records-math.jsonl").stat().st_mtime_ns == stamp
    assert len(lines("text")) == 6 and {json.loads(x)["prompt_id"] for x in lines("text")} == {"1"}
    (out / "records-text.jsonl").write_text("\n".join(lines("text")[:-1]) + "\n")  # an interrupted group
    markdown = run(everything)
    assert len(lines("text")) == 12 and (out / "records-math.jsonl").stat().st_mtime_ns == stamp
    assert sorted(json.loads(x)["prompt_id"] for x in lines("text")) == ["1"] * 6 + ["4"] * 6
    for name in (
        "frontier.md",
        "frontier.json",
        "speed_quality.png",
        "rejection_quality.png",
        "slim_costs.json",
        "profile.json",
    ):
        assert (out / name).stat().st_size > 0, name
    assert "via-sd[1l]@0.5/0.3" in markdown and "MODELLED, not measured" in markdown
    summary = json.loads((out / "frontier.json").read_text())
    ar = next(p for p in summary["points"] if p["name"] == "ar")
    assert ar["agreement"] == 1.0 and ar["full_per_token"] == pytest.approx(1.0) and ar["records"] == 3
    assert run(report) == markdown  # rebuilt from the records alone, the same report


def test_a_powered_job_runs_its_points_on_its_shard_and_resumes_when_cut(tmp_path):
    """A (points, shard) job of a powered quality run: only its points, only its shard's prompts;
    cut mid-shard, the rerun finishes it with the records an uncut job writes."""
    from viasd_adapters.bench.quality import load_records
    from viasd_adapters.cli.frontier import run

    rows = [
        {"question_id": i, "category": "math_reasoning", "turns": [f"What is {i} + 3?"], "reference": [f"#### {i + 3}"]}
        for i in range(5)
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "runtime.draft_weights=float32",
        "method=[ar,sd-confident,tiered-fast]",
        "sweep.references=[ar,sd-confident]",
        "sweep.masks=[tiny-random-1l]",
        "sweep.thresholds=[[0.5,0.3]]",
        "sweep.random_masks=null",
        "sweep.random_thresholds=null",
        "sweep.gated=[]",
        "sweep.alphas=[]",
        "sweep.cascade=null",
        "sweep.intermediate=null",
        f"tasks.math.prompts_file={prompts}",
        "tasks.math.limit=null",
        "tasks.math.max_new_tokens=5",
        "~tasks.text",
        "~tasks.code",
        "only=[math]",
        "points=[sd-confident,'via-sd[1l]@0.5/0.3']",
        "shard=1",
        "shards=2",
        "measure_costs=false",
        "progress=false",
        "warmup_tokens=2",
    ]

    def compose_job(out, *more):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="frontier", overrides=[*overrides, f"out_dir={out}", *more])

    cut, whole = tmp_path / "cut", tmp_path / "whole"
    run(compose_job(cut, "chunk_prompts=1"))  # the job is cut after its first prompt
    lines = (cut / "records-math.jsonl").read_text().splitlines()
    assert sorted({json.loads(x)["method"] for x in lines}) == ["sd-confident", "via-sd[1l]@0.5/0.3"]
    assert {json.loads(x)["prompt_id"] for x in lines} == {"1"}
    (cut / "records-math.jsonl").write_text(lines[0] + "\n" + lines[1][:20])  # and cut again, mid-record
    run(compose_job(cut))
    run(compose_job(whole))
    decoded = lambda out: {
        (r["method"], r["prompt_id"]): r["output_tokens"]
        for r in map(json.loads, (out / "records-math.jsonl").read_text().splitlines())
    }
    assert decoded(cut) == decoded(whole)
    assert sorted({pid for _, pid in decoded(cut)}) == ["1", "3"]  # shard 1 of 2: prompts 1 and 3
    assert set(load_records(cut, "via-sd[1l]@0.5/0.3")) == {("math_reasoning", "1"), ("math_reasoning", "3")}
    with pytest.raises(ValueError, match=r"points=\['nope'\]: not points of this sweep"):
        run(compose_job(tmp_path / "bad", "points=[nope]"))
    # answers cut at the budget are decoded again, with a larger one, in their own run directory
    rerun = tmp_path / "rerun"
    run(compose_job(rerun, "prompt_ids=[3]", "tasks.math.max_new_tokens=8", "shard=0", "shards=1"))
    assert sorted(decoded(rerun)) == [("sd-confident", "3"), ("via-sd[1l]@0.5/0.3", "3")]
    with pytest.raises(ValueError, match=r"prompt_ids=\['7'\]: not prompts of the tasks"):
        run(compose_job(tmp_path / "bad", "prompt_ids=[3,7]"))


def test_gated_twins_carry_a_calibrated_gate():
    from viasd_adapters.bench.frontier import gated_point

    cfg = compose_frontier(
        "model_pair=tiny-random",
        "sweep.masks=[tiny-random-1l]",
        "sweep.random_masks=null",
        "sweep.thresholds=[[0.5,0.3]]",
        "sweep.gated=['via-sd[1l]@0.5/0.3']",
    )
    sweep = instantiate(cfg.sweep, _convert_="all")
    import inspect

    from viasd_adapters.verify import TieredVerifier

    if "gate" not in inspect.signature(TieredVerifier.__init__).parameters:
        with pytest.raises(ValueError, match="gate"):
            build_points(sweep, cfg.method, load_routing(sweep.masks))
        sweep.gated = []
    points = build_points(sweep, cfg.method, load_routing(sweep.masks))
    twin = gated_point(next(p for p in points if p.name == "via-sd[1l]@0.5/0.3"), 0.4)
    assert twin.name == "via-sd[1l]@0.5/0.3+gate" and twin.kind == "via-sd"
    assert twin.verifier.gate.min_confidence == 0.4 and twin.verifier.policy.tau_slim == 0.3
    if "gate" in inspect.signature(TieredVerifier.__init__).parameters:
        with pytest.raises(ValueError, match="not VIA-SD points"):
            build_points(SweepConfig(alphas=[0.5], gated=["faster-cascade@0.5"]), cfg.method, {})


def test_gated_point_is_calibrated_on_calibration_prompts_and_run(tmp_path):
    from viasd_adapters.cli.frontier import run

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    calibration = tmp_path / "calibration.jsonl"  # the gate's prompts come from the end of each category
    calibration.write_text(
        "".join(
            json.dumps({"question_id": 100 + 10 * k + i, "category": c, "turns": [f"{c} {i}: go on."]}) + "\n"
            for k, c in enumerate(("translation", "qa"))
            for i in range(4)
        )
    )
    out = tmp_path / "out"
    overrides = [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "runtime.draft_weights=float32",
        "sweep.masks=[tiny-random-1l]",
        "sweep.random_masks=null",
        "sweep.random_thresholds=null",
        "sweep.thresholds=[[0.5,0.3]]",
        "sweep.alphas=[]",
        "sweep.cascade=null",
        "sweep.intermediate=null",
        "sweep.gated=['via-sd[1l]@0.5/0.3']",
        f"tasks.text.prompts_file={prompts}",
        "tasks.text.categories=[qa]",
        "tasks.text.max_new_tokens=6",
        "~tasks.code",
        "~tasks.math",
        "progress=false",
        "profile.context=16",
        "profile.tokens=[1,4]",
        "profile.prefill=[24,32]",
        "profile.repetitions=2",
        "warmup_tokens=2",
        f"gate.prompts.sources=[{{kind: spec_bench, path: '{calibration}', categories: [translation, qa], num_prompts: 2}}]",
        "gate.prompts.per_category=1",
        "gate.max_new_tokens=8",
        f"out_dir={out}",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="frontier", overrides=overrides)
    markdown = run(cfg)
    gates = json.loads((out / "gates.json").read_text())
    choice = gates["via-sd[1l]@0.5/0.3"]
    assert choice["blocks"] > 0 and 0.0 <= choice["min_confidence"] <= 1.0
    assert 0 < choice["slim_ratio"] and 0 < choice["escalate_ratio"]
    names = [p["name"] for p in json.loads((out / "points.json").read_text())]
    assert names == ["ar", "sd-adaptive-int8", "via-sd[1l]@0.5/0.3", "via-sd[1l]@0.5/0.3+gate"]
    assert "via-sd[1l]@0.5/0.3+gate" in markdown
