"""Every script in examples/ runs, on tiny models (or SmolLM2) and tiny budgets, as a user would run it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import perturbed, tiny

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# A script runs from another working directory and must still import this checkout.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args: str, cwd: Path, config_dir: Path | None = None) -> str:
    env = dict(ENV, **({"VIASD_CONFIG_DIR": str(config_dir)} if config_dir else {}))
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """A tiny target and a draft that mostly agrees with it, saved as transformers folders."""
    root = tmp_path_factory.mktemp("tiny-pair")
    target = tiny(seed=0)
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    draft = perturbed(target.model, scale=0.02)
    draft.save_pretrained(root / "draft")
    target.tokenizer.save_pretrained(root / "draft")
    return root / "target", root / "draft"


def test_every_example_is_tested():
    tested = {"own_pair", "pearl", "upgrade_eagle", "search_and_calibrate", "benchmark_prompts"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_own_pair_in_python_and_through_generate(tiny_folders, tmp_path):
    target, draft = tiny_folders
    args = [
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--routing",
        "tiny-random-1l",
        "--policy",
        "0.0",
        "0.0",
        "--prompt",
        "hello",
        "--max-new-tokens",
        "24",
        "--threads",
        "1",
    ]
    result = load_example("own_pair").main(args)
    assert result["identical"] == {"lossless SD": True, "custom_generate": True}
    assert result["tiers"].get("accept", 0) + result["tiers"].get("slim", 0) > 0  # the tiers did work
    stdout = run_script("own_pair", *args, cwd=tmp_path)  # as a user runs it, from another directory
    assert "tiers off, identical to target.generate: {'lossless SD': True, 'custom_generate': True}" in stdout


def test_pearl_with_and_without_tiers(tiny_folders, tmp_path):
    target, draft = tiny_folders
    stdout = run_script(
        "pearl",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--routing",
        "tiny-random-1l",
        "--policy",
        "1.0",
        "1.0",
        "--prompt",
        "hello",
        "--max-new-tokens",
        "24",
        "--backend",
        "thread",
        cwd=tmp_path,
    )
    lines = stdout.splitlines()
    assert any(line.startswith("PEARL ") and line.endswith("identical to AR: True") for line in lines), stdout
    # thresholds of 1: the slim verifier runs and every token escalates, so this is lossless too
    assert any(line.startswith("VIA-SD on PEARL") and line.endswith("identical to AR: True") for line in lines), stdout


def test_upgrade_eagle_deployment(tmp_path):
    pytest.importorskip("eagle.model.utils")
    from viasd_adapters.third_party.eagle import build_head, head_config, save_head

    target = tiny(seed=0)  # an "existing deployment": a target folder and an EAGLE head folder
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")
    config = head_config(target.model.config, intermediate_size=96)
    torch.manual_seed(0)
    save_head(build_head(config), config, tmp_path / "head", full=False, compact=True)
    stdout = run_script(
        "upgrade_eagle",
        "--base",
        str(tmp_path / "target"),
        "--head",
        str(tmp_path / "head"),
        "--routing",
        "tiny-random-1l",
        "--policy",
        "0.0",
        "0.0",
        "--prompt",
        "hello",
        "--max-new-tokens",
        "24",
        "--threads",
        "1",
        cwd=tmp_path,
    )
    assert "stock EAGLE: eagenerate" in stdout and "VIA-SD EAGLE: eagenerate" in stdout
    assert stdout.count("done in") == 3  # loading and both generations report their time
    calls = eval(stdout.split("forward calls: ")[1].splitlines()[0])  # noqa: S307 - our own printout
    assert calls["slim"] > 0 and calls["target"] > 0
    assert "token agreement with stock EAGLE: " in stdout and "speed ratio" in stdout


def test_benchmark_your_own_prompt_file(tmp_path):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("first prompt, with a comma = and an equals sign\n\nsecond prompt\n", encoding="utf-8")
    stdout = run_script(
        "benchmark_prompts",
        "--prompts",
        str(prompts),
        "--model-pair",
        "tiny-random",
        "--methods",
        "ar",
        "sd",
        "--max-new-tokens",
        "8",
        "--repetitions",
        "1",
        "--out-dir",
        str(tmp_path / "run"),
        "runtime.weights=float32",
        "warmup=0",
        "plots=false",
        "progress=false",
        cwd=tmp_path,
    )
    assert "running: viasd-bench model_pair=tiny-random task=jsonl" in stdout
    records = [line for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines() if line]
    assert len(records) == 2 * 2  # two methods, two prompts, one repetition
    assert "| sd |" in (tmp_path / "run" / "table.md").read_text()


def test_readme_starts_with_a_working_five_line_quickstart(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    before = readme.split("```python\n", 1)[0]
    assert "```" not in before and len(before.splitlines()) < 15  # it is the first thing a reader sees
    assert len(block.strip().splitlines()) == 5
    script = tmp_path / "quickstart.py"
    script.write_text(block, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout.strip().lower()
    assert len(text.split()) > 10 and ("sky" in text or "blue" in text), text  # SmolLM2 answered the question


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_search_and_calibrate_then_use_both(tmp_path):
    config_dir = tmp_path / "user-conf"  # where the results are installed, instead of ~/.config
    calibration = ["calibration.per_category=1", "calibration.max_new_tokens=8", "calibration.max_prompt_tokens=16"]
    stdout = run_script(
        "search_and_calibrate",
        "--model-pair",
        "tiny-random",
        "--search",
        "quick",
        "--budget",
        "1",
        "--name",
        "mine",
        "--max-new-tokens",
        "8",
        "--threads",
        "1",
        "--out-dir",
        str(tmp_path / "run"),
        "--search-overrides",
        "search.config.num_random=2",
        "search.config.num_tpe=2",
        "progress=false",
        *calibration,
        "--calibrate-overrides",
        "grid=[[0.9,0.9],[0.5,0.5]]",
        "max_new_tokens=8",
        "progress=false",
        "prompts.per_category=1",
        "prompts.max_new_tokens=8",
        # the shipped calibration prompts are longer than the tiny models' default 512-token window
        "+model_pair.target.tiny.max_position_embeddings=2048",
        "+model_pair.draft.tiny.max_position_embeddings=2048",
        cwd=tmp_path,
        config_dir=config_dir,
    )
    assert (config_dir / "routing" / "mine.yaml").is_file() and (config_dir / "policy" / "mine.yaml").is_file()
    assert (tmp_path / "run" / "search" / "mask.yaml").is_file()
    assert "$ viasd-generate model_pair=tiny-random verifier=tiered routing=mine policy=mine" in stdout
    assert "[VIA-SD on SD] new tokens 8 |" in stdout  # the CLI used both
    assert "-> VIA-SD on SD" in stdout  # and so did Python
    from viasd_adapters.routing import RoutingMask

    mask = RoutingMask.from_yaml(config_dir / "routing" / "mine.yaml")
    assert len(mask.skip_layers) == 1 and f"mask: {mask.describe()}" in stdout
