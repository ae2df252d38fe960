"""viasd-search and viasd-eval-mask end to end on a tiny random model (run(cfg), as @hydra.main calls it)."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from viasd_adapters.cli import eval_mask as eval_cli
from viasd_adapters.cli import search as search_cli
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.routing import RoutingMask
from viasd_adapters.search.calibration import PromptSource, select_prompts

CONF = CONFIG_DIR


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "questions.jsonl"
    rows = [
        {"question_id": 10 * c + i, "category": cat, "turns": [f"{cat} question {i}: say something."]}
        for c, cat in enumerate(["qa", "writing"])
        for i in range(6)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def tiny_overrides(tmp_path, prompts_file) -> list[str]:
    return [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "progress=false",
        f"cache_dir={tmp_path}/cache",
        f"calibration.sources=[{{kind: spec_bench, path: '{prompts_file}', num_prompts: 2}}]",
        "calibration.max_new_tokens=12",
    ]


def test_calibration_splits_are_disjoint_and_from_the_end(prompts_file):
    source = PromptSource("spec_bench", 2, str(prompts_file))
    calib = select_prompts(source, "calibration", 1)
    held = select_prompts(source, "heldout", 1)
    assert calib == [
        ("spec_bench/5", "qa question 5: say something."),
        ("spec_bench/15", "writing question 5: say something."),
    ]
    assert [p for p, _ in held] == ["spec_bench/4", "spec_bench/14"]
    # Two per category: the last two of each category, round-robin; held out: the two before.
    assert [p for p, _ in select_prompts(PromptSource("spec_bench", 4, str(prompts_file)), "calibration", 2)] == [
        "spec_bench/5",
        "spec_bench/15",
        "spec_bench/4",
        "spec_bench/14",
    ]
    assert [p for p, _ in select_prompts(source, "heldout", 2)] == ["spec_bench/3", "spec_bench/13"]
    with pytest.raises(ValueError, match="too few"):
        select_prompts(source, "heldout", 3)


def test_search_writes_into_the_user_config_dir_and_resumes(tmp_path, prompts_file, monkeypatch):
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    overrides = tiny_overrides(tmp_path, prompts_file) + [
        "search=layers",
        "search.budget.amount=2",
        "search.config.num_random=3",
        "search.config.num_tpe=4",
        "search.baselines.greedy=2",
        f"out_dir={tmp_path}/out",
        "mask_name=tiny-2l",
        f"docs_dir={tmp_path}/docs",
    ]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("search", overrides=overrides)
    shipped = sorted(p.relative_to(CONF) for p in Path(CONF).rglob("*.yaml"))
    out = search_cli.run(cfg)
    assert len(out.mask.skip_layers) == 2 and out.mask.num_layers == 4
    assert len(out.result.trials) == 2 + 3 + 4  # the sensitivity and greedy seeds, random, TPE
    # greedy removal's mask of the budget is evaluated first, as a seed (so the search can never
    # do worse than it on this text: that is no finding, and the provenance says it was a seed)
    seeds = out.result.of_phase("seed")
    assert out.baselines.greedy[-1].mask.skips in {t.mask.skips for t in seeds}
    assert out.mask.provenance["seeds"] == ["sensitivity", "greedy"]
    assert out.installed == tmp_path / "user" / "routing" / "tiny-2l.yaml" and out.override == "routing=tiny-2l"
    assert sorted(p.relative_to(CONF) for p in Path(CONF).rglob("*.yaml")) == shipped  # the package is untouched
    installed = instantiate(OmegaConf.load(out.installed))
    assert installed == out.mask == instantiate(OmegaConf.load(out.mask_path))
    for key in ("model", "kl", "top1", "budget", "trials", "search_seconds", "date", "greedy", "random_median"):
        assert key in installed.provenance, key
    report = (tmp_path / "docs" / "report.md").read_text()
    assert "Per-layer sensitivity" in report and "greedy removal" in report and "random masks" in report
    assert (tmp_path / "docs" / "best_cost.png").stat().st_size > 1000

    # The printed override selects the written mask in any command (the user dir is on the search path).
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        chosen = compose("generate", overrides=["model_pair=tiny-random", out.override])
    assert instantiate(chosen.routing) == out.mask

    # Run again: trials resume from trials.pkl, evaluations come from the store.
    again = search_cli.run(cfg)
    assert again.result.resumed_from == 9 and again.result.evaluations == 0
    assert again.mask == out.mask


def test_search_refuses_bad_mask_names_before_loading(tmp_path, prompts_file, monkeypatch):
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    for name, message in [("tiny-random-1l", "shipped with the package"), ("../x", "use letters")]:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("search", overrides=tiny_overrides(tmp_path, prompts_file) + [f"mask_name={name}"])
        with pytest.raises(ValueError, match=message):
            search_cli.run(cfg)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(
            "search",
            overrides=[
                "model_pair=tiny-random",
                f"cache_dir={tmp_path}/cache",
                f"calibration.sources.0.path={tmp_path}/missing.jsonl",
            ],
        )
    with pytest.raises(ValueError, match=r"does not exist.*set calibration\.sources\.0\.path=PATH"):
        search_cli.run(cfg)
    assert not (tmp_path / "cache").exists()  # it stopped before any model or text was built
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(
            "search", overrides=tiny_overrides(tmp_path, prompts_file) + ["search.seeds=[routing:no-such-mask]"]
        )
    with pytest.raises(ValueError, match="no routing mask for seed 'routing:no-such-mask'.*tiny-random-1l"):
        search_cli.run(cfg)
    assert not (tmp_path / "cache").exists()


def test_a_seed_mask_comes_from_the_user_config_dir_or_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "user"))
    RoutingMask(skip_layers=(1,), num_layers=4).to_yaml(tmp_path / "user" / "routing" / "mine.yaml")
    elsewhere = RoutingMask(skip_layers=(3,), num_layers=4).to_yaml(tmp_path / "other.yaml")
    known = search_cli._known_seeds(["sensitivity", "routing:mine", f"routing:{elsewhere}"])
    assert known["routing:mine"].skip_layers == (1,)
    assert known[f"routing:{elsewhere}"].skip_layers == (3,)
    with pytest.raises(ValueError, match="unknown seed 'best'"):
        search_cli._known_seeds(["best"])


def test_a_mask_file_is_accepted_directly(tmp_path):
    from viasd_adapters.cli import apply_routing_file

    path = RoutingMask(skip_layers=(1, 2), num_layers=4, model="tiny-random").to_yaml(tmp_path / "m.yaml")
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("generate", overrides=["model_pair=tiny-random", "verifier=tiered", f"routing_file={path}"])
    assert instantiate(cfg.routing).skip_layers == (2,)  # the pair's own mask, tiny-random-1l, until applied
    apply_routing_file(cfg)
    assert instantiate(cfg.routing).skip_layers == (1, 2)
    assert instantiate(cfg.verifier.slim.mask).skip_layers == (1, 2)  # what the tiered verifier's slim model gets
    for bad, message in [(tmp_path / "nope.yaml", "no such file"), (prompts_file_like(tmp_path), "not a routing mask")]:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("generate", overrides=["model_pair=tiny-random", f"routing_file={bad}"])
        with pytest.raises(ValueError, match=message):
            apply_routing_file(cfg)


def prompts_file_like(tmp_path) -> Path:
    path = tmp_path / "not-a-mask.yaml"
    path.write_text("skip_layers: [1]\nunknown_field: 3\n")
    return path


def test_eval_mask(tmp_path, prompts_file):
    overrides = tiny_overrides(tmp_path, prompts_file) + [
        "routing=none",
        "routing.skip_layers=[2]",
        "num_random=2",
        "timing.repetitions=2",
        "timing.warmup=0",
        "timing.context_tokens=20",
        f"out_dir={tmp_path}/eval",
        f"docs_dir={tmp_path}/docs",
        f"greedy_calibration.sources=[{{kind: spec_bench, path: '{prompts_file}', num_prompts: 2}}]",
        "greedy_calibration.max_new_tokens=12",
    ]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("eval_mask", overrides=overrides)
    out = eval_cli.run(cfg)
    assert out.mask.skip_layers == (2,)
    assert len(out.random) == 2 and all(m.skip_layers != (2,) for m, _ in out.random)
    assert out.greedy is not None and len(out.greedy[0].skip_layers) == 1
    assert [t.new_tokens for t in out.timing] == [1, 8]
    summary = json.loads(out.path.read_text())
    assert summary["heldout"]["split"] == "heldout" and summary["found"]["num_positions"] > 0
    assert "greedy removal" in (tmp_path / "docs" / "heldout.md").read_text()
    with pytest.raises(ValueError, match="skips nothing"):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            eval_cli.run(compose("eval_mask", overrides=tiny_overrides(tmp_path, prompts_file) + ["routing=none"]))


def test_every_routing_config_instantiates():
    files = sorted((Path(CONF) / "routing").glob("*.yaml"))
    assert any(f.stem == "none" for f in files)
    for file in files:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("eval_mask", overrides=[f"routing={file.stem}"])
        mask = instantiate(cfg.routing)
        assert isinstance(mask, RoutingMask)
        if file.stem != "none":
            assert mask.num_layers and mask.model, file
        if mask.provenance.get("method", "").startswith("DIMR"):  # searched masks carry their provenance
            for key in ("kl", "top1", "budget", "calibration", "trials", "search_seconds", "date"):
                assert key in mask.provenance, (file, key)


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(CONF) / "search").glob("*.yaml")))
def test_every_search_config_composes(option):
    from viasd_adapters.search import Budget, SearchConfig

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("search", overrides=[f"search={option}"])
    Budget(**cfg.search.budget)
    SearchConfig(**cfg.search.config)
    assert cfg.calibration.split == "calibration"


def test_calibration_texts_are_cached_per_prompt(tmp_path, prompts_file):
    from tests.conftest import tiny
    from viasd_adapters.search import CalibrationConfig, build_calibration

    loaded = tiny(seed=0)
    source = {"kind": "spec_bench", "path": str(prompts_file), "num_prompts": 1}
    one = build_calibration(loaded, CalibrationConfig([source], max_new_tokens=6), tmp_path, progress=False)
    files = list((tmp_path / "calibration").glob("*.json"))
    assert len(files) == 1 and len(json.loads(files[0].read_text())["texts"]) == 1
    two = build_calibration(
        loaded, CalibrationConfig([{**source, "num_prompts": 2}], max_new_tokens=6), tmp_path, progress=False
    )
    assert two.texts[0] == one.texts[0] and len(two.texts) == 2 and two.key != one.key
    assert len(json.loads(files[0].read_text())["texts"]) == 2  # the first text was reused, the second added
    assert all(t.num_scored == 6 and len(t.ids) > 6 for t in two.texts)


def test_cost_aware_search_prices_masks_with_a_profile(tmp_path, prompts_file):
    import torch

    from viasd_adapters.costs import LatencyEntry, LatencyProfile

    # The tiny target whole (layers None) and as slim views: 0.1 ms per call and 0.225 per layer run
    entries = [
        LatencyEntry(
            "tiny-random",
            "float32",
            torch.get_num_threads(),
            128,
            n,
            0.1 + 0.225 * l,
            layers=None if l == 4 else float(l),
        )
        for l in (4, 3, 2)
        for n in (1, 6)
    ]
    profile = LatencyProfile(entries=entries, model_layers={"tiny-random": 4}).save(tmp_path / "profile.json")
    base = tiny_overrides(tmp_path, prompts_file) + [
        "search=layers",
        "search.budget.amount=1",
        "search.config.num_random=2",
        "search.config.num_tpe=2",
        "search.baselines.sensitivity=false",
        "search.config.cost=expected",
        f"out_dir={tmp_path}/out-expected",
        "search.candidates=[layer1,layer3,layer2]",  # explicit blocks: no sensitivity table needed
    ]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(
            "search", overrides=base + [f"search.expected.profile={profile}", "search.seeds=[routing:tiny-random-1l]"]
        )
        no_profile = compose("search", overrides=base + ["search.seeds=[]"])
        misfit = compose(
            "search",
            overrides=base
            + [f"search.expected.profile={profile}", "search.budget.amount=2", "search.seeds=[routing:tiny-random-1l]"],
        )
    with pytest.raises(ValueError, match="profile"):
        search_cli.run(no_profile)
    out = search_cli.run(cfg)
    seed = out.result.trials[0]
    assert seed.phase == "seed" and seed.mask.skip_layers == (2,)  # the shipped tiny mask, priced
    for t in out.result.trials:
        assert t.mask.skip_layers[0] in (1, 2, 3)
        assert t.loss == pytest.approx(t.metrics.expected) and 0.0 <= t.metrics.settled <= 1.0
        assert t.metrics.block_cost > 0
    facts = out.mask.provenance["expected_cost"]
    assert facts["block"] == 5 and facts["profile"].endswith(
        "torch threads" if torch.get_num_threads() > 1 else "thread"
    )
    report = out.report_path.read_text()
    best = out.result.best.metrics
    assert "Expected verify cost per block" in report
    assert f"| {best.settled:.3f} | {best.wrong:.3f} | {best.block_cost:.3f} | {best.expected:.3f} |" in report
    with pytest.raises(ValueError, match="does not fit"):
        search_cli.run(misfit)


def test_cost_aware_search_ranks_single_blocks_by_kl():
    """A single late layer has the lowest expected cost (its escalations are short) whatever harm it
    does, so candidates and the sensitivity seed come from the KL ranking under cost=expected."""
    from viasd_adapters.search import MaskMetrics
    from viasd_adapters.search.greedy import Sensitivity
    from viasd_adapters.search.report import Baselines
    from viasd_adapters.search.space import Budget, MaskSpace

    # layer:      0     1     2     3
    kl = [3.0, 0.1, 0.2, 2.0]
    expected = [1.0, 0.9, 0.8, 0.5]  # the last layers look cheapest alone
    rows = [MaskMetrics(k, 0.5, 10, expected=e, block_cost=e, settled=0.0, wrong=0.0) for k, e in zip(kl, expected)]
    baselines = Baselines(sensitivity=Sensitivity(rows))
    assert search_cli._candidates(2, baselines, "layers", "expected") == [("layer", 1), ("layer", 2)]
    assert search_cli._candidates(2, baselines, "layers", "kl") == [("layer", 1), ("layer", 2)]
    space = MaskSpace(4, Budget("layers", 2))
    ((kind, seed),) = search_cli._seed_masks(["sensitivity"], {}, space, baselines, "expected")
    assert seed.skip_layers == (1, 2)
