"""`viasd-bench` end to end on the tiny random pair (built in memory), and its config groups."""

import json
import re
import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from viasd_adapters.bench.harness import rotated
from viasd_adapters.cli.bench import run
from viasd_adapters.configs import CONFIG_DIR

CONF = Path(CONFIG_DIR)
PROMPTS = [
    {
        "question_id": 1,
        "category": "translation",
        "turns": ["Translate German to English: Guten Morgen"],
        "reference": ["Good morning"],
    },
    {
        "question_id": 2,
        "category": "translation",
        "turns": ["Translate German to English: Danke schoen"],
        "reference": "Thank you",
    },
    {"question_id": 3, "category": "math_reasoning", "turns": ["What is 2 + 3?"], "reference": ["2 + 3 = 5\n#### 5"]},
    {"question_id": 4, "category": "qa", "turns": ["Who wrote Faust?", "When?"]},
]


def compose_bench(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="bench", overrides=list(overrides))


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    cfg = compose_bench(
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "method=[ar,sd]",
        "task=jsonl",
        f"task.prompts_file={prompts}",
        "repetitions=2",
        "max_new_tokens=8",
        f"out_dir={tmp / 'out'}",
        "progress=false",
    )
    return run(cfg)


def read_records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]


def test_one_record_per_method_prompt_and_repetition(tiny_run):
    records = read_records(tiny_run.out_dir)
    assert records == json.loads(json.dumps(tiny_run.records))  # what was returned was written
    keys = Counter((r["method"], r["prompt_id"], r["rep"]) for r in records)
    assert len(keys) == 2 * 4 * 2 and set(keys.values()) == {1}
    for name in ("table.md", "summary.json", "meta.json", "config.yaml", "speedup_quality.png", "tier_shares.png"):
        assert (tiny_run.out_dir / name).stat().st_size > 0


def test_records_hold_speed_cost_quality_and_load(tiny_run):
    records = tiny_run.records
    ar = [r for r in records if r["method"] == "ar"]
    sd = [r for r in records if r["method"] == "sd"]
    for r in records:
        assert r["seconds"] > 0 and r["tokens_per_second"] == pytest.approx(r["new_tokens"] / r["seconds"])
        assert r["peak_rss_mb"] > 0 and r["loadavg_1m_start"] >= 0 and 0 <= r["system_cpu_percent"] <= 100
        assert r["full_calls_per_token"] == pytest.approx(r["model_calls"]["target"]["calls"] / r["new_tokens"])
        assert r["slim_calls_per_token"] == 0  # no slim tier in ar / sd
    assert all(r["speedup_vs_baseline"] == 1.0 and r["rejection_rate"] is None for r in ar)
    assert all(r["tier_counts"] == {} for r in ar)
    for r in sd:  # fp32 greedy SD is lossless: same tokens as AR, only the speed differs
        assert r["exact_match_vs_baseline"] == 1.0 and r["token_match_vs_baseline"] == 1.0
        assert set(r["model_calls"]) == {"draft", "target"} and set(r["tier_counts"]) == {"full"}
        assert r["tier_shares"] == {"full": 1.0}
        base = next(a for a in ar if (a["prompt_id"], a["rep"]) == (r["prompt_id"], r["rep"]))
        assert r["speedup_vs_baseline"] == pytest.approx(r["tokens_per_second"] / base["tokens_per_second"])
        assert r["output_tokens"] == base["output_tokens"]
    # The tiny pair's draft is a perturbed copy of the target: accepted drafts went through the harness.
    assert 0.1 < statistics.median(1 - r["rejection_rate"] for r in sd) < 0.95
    by_category = {r["category"]: r for r in records}
    assert by_category["translation"]["quality_metric"] == "bleu"
    assert by_category["math_reasoning"]["quality_metric"] == "math_accuracy"
    assert (
        by_category["qa"]["quality_metric"] == "answer_match" and by_category["qa"]["quality"] is None
    )  # no reference


def test_method_order_rotates_per_prompt_and_repetition(tiny_run):
    firsts = Counter(r["method"] for r in tiny_run.records if r["slot"] == 0)
    assert firsts == {"ar": 4, "sd": 4}
    assert [m for m in rotated(["a", "b", "c"], 4)] == ["b", "c", "a"]


def parse_table(table: str, section: str) -> list[dict[str, str]]:
    body = table.split(f"### {section}")[1].split("###")[0]
    rows = [line for line in body.splitlines() if line.startswith("|")]
    header = [h.strip() for h in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in rows[2:]]


def test_markdown_table_matches_the_jsonl_records(tiny_run):
    records = read_records(tiny_run.out_dir)
    table = (tiny_run.out_dir / "table.md").read_text()
    assert table == tiny_run.table
    rows = {row["method"]: row for row in parse_table(table, "All prompts")}
    assert set(rows) == {"ar", "sd"}
    for method, row in rows.items():
        mine = [r for r in records if r["method"] == method]
        med = lambda key, mine=mine: statistics.median(r[key] for r in mine)
        assert row["n"] == str(len(mine))
        assert row["tok/s"] == f"{med('tokens_per_second'):.2f}"
        assert row["speedup vs ar"] == f"{med('speedup_vs_baseline'):.2f}"
        assert row["speedup vs sd"] == f"{med('speedup_vs_host'):.2f}"
        assert row["accepted length"] == f"{med('mean_accepted_length'):.2f}"
        assert row["full calls/token"] == f"{med('full_calls_per_token'):.3f}"
        assert row["peak RSS MB"] == f"{med('peak_rss_mb'):.0f}"
        assert row["token match vs ar"] == f"{statistics.fmean(r['token_match_vs_baseline'] for r in mine):.3f}"
    assert rows["ar"]["rejection rate"] == "–"
    assert (
        rows["sd"]["rejection rate"]
        == f"{statistics.median(r['rejection_rate'] for r in records if r['method'] == 'sd'):.3f}"
    )
    per_category = parse_table(table, "Per category")
    bleu_row = next(r for r in per_category if r["category"] == "translation" and r["method"] == "sd")
    bleus = [r["quality"] for r in records if r["category"] == "translation" and r["method"] == "sd"]
    assert bleu_row["quality (mean)"] == f"bleu {statistics.fmean(bleus):.1f}"
    assert re.search(r"1-min load average [\d.]+-[\d.]+ on \d+ cores", table)


def test_baseline_must_be_among_the_methods(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0]) + "\n")
    cfg = compose_bench(
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "method=[sd]",
        "task=jsonl",
        f"task.prompts_file={prompts}",
        f"out_dir={tmp_path / 'out'}",
    )
    with pytest.raises(ValueError, match="baseline method 'ar' is not among the methods"):
        run(cfg)


def test_a_bad_prompt_file_fails_first_and_leaves_nothing_behind(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "category": "qa", "prompt": "hi"}) + "\n")
    out = tmp_path / "out"
    overrides = [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "task=jsonl",
        f"out_dir={out}",
        "progress=false",
        "repetitions=1",
        "max_new_tokens=4",
        "plots=false",
    ]
    with pytest.raises(ValueError, match=r"bad.jsonl:1: unknown field\(s\) \['prompt'\]"):
        run(compose_bench(*overrides, f"task.prompts_file={bad}"))
    assert not out.exists()  # no records.jsonl that would block the corrected rerun
    with pytest.raises(ValueError, match=r"does not exist.*set task\.prompts_file=PATH"):
        run(compose_bench(*overrides, f"task.prompts_file={tmp_path / 'typo.jsonl'}"))
    assert not out.exists()

    bad.write_text(json.dumps(PROMPTS[2]) + "\n")  # corrected: the same command now runs
    outcome = run(compose_bench(*overrides, f"task.prompts_file={bad}"))
    assert outcome.out_dir == out and len(read_records(out)) == 2  # ar and sd, one prompt, one repetition


def test_the_default_task_runs_on_the_shipped_prompts(tmp_path):
    """No prompt file given: the set shipped in the package, one prompt per category."""
    cfg = compose_bench(
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "method=[ar]",
        "host=null",
        "task.categories=[rag,qa]",
        "repetitions=1",
        "max_new_tokens=4",
        "plots=false",
        "progress=false",
        f"out_dir={tmp_path / 'out'}",
    )
    records = run(cfg).records
    assert [(r["category"], r["prompt_id"]) for r in records] == [("rag", "41"), ("qa", "25")]
    assert all(r["quality_metric"] == "answer_match" and r["quality"] in (0.0, 1.0) for r in records)


def test_the_code_edit_prompts_hold_a_module_that_parses():
    import ast
    import re

    prompts = instantiate(compose_bench("task=code_edit").task, _convert_="all").prompts()
    assert len(prompts) == 6 and {p.category for p in prompts} == {"code_edit"}
    for p in prompts:
        [code] = re.findall(r"```python\n(.*?)```", p.text, flags=re.S)
        assert 25 <= len(code.splitlines()) <= 45
        ast.parse(code)


@pytest.mark.parametrize("method", options("method"))
def test_every_method_file_composes_under_its_own_name(method):
    cfg = compose_bench(f"method=[{method}]")
    assert list(cfg.method) == [method]  # the file's `# @package method.<name>` matches its name
    assert {"framework", "verifier"} <= set(cfg.method[method])
    assert "_target_" in cfg.method[method].framework.decoder


@pytest.mark.parametrize("task", options("task"))
def test_every_task_file_instantiates(task, tmp_path):
    overrides = [f"task={task}"] + ([f"task.prompts_file={tmp_path}/p.jsonl"] if task == "jsonl" else [])
    cfg = compose_bench(*overrides)
    assert instantiate(cfg.task, _convert_="all").name == task


@pytest.fixture(scope="module")
def cores_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cores")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS[:2]))
    cfg = compose_bench(
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "method=[ar,ar-2t,sd,sd-2t]",
        "task=jsonl",
        f"task.prompts_file={prompts}",
        "repetitions=1",
        "max_new_tokens=8",
        f"out_dir={tmp / 'out'}",
        "progress=false",
        "runtime.threads=1",
        "plots=false",
    )
    return run(cfg)


def test_records_state_cores_and_cpu_time_and_pair_equal_cores(cores_run):
    by = {(r["method"], r["prompt_id"]): r for r in cores_run.records}
    for r in cores_run.records:
        two = r["method"].endswith("-2t")
        assert (r["threads"], r["cores"]) == ((2, 2) if two else (1, 1))
        assert r["kind"] == r["method"].removesuffix("-2t")
        # the kernel counts CPU time in 10 ms ticks, which one 8-token tiny generation may not reach
        assert r["cpu_seconds"] >= 0 and r["cpu_seconds_per_token"] == pytest.approx(r["cpu_seconds"] / r["new_tokens"])
        base = by[("ar-2t" if two else "ar", r["prompt_id"])]
        assert r["baseline_same_cores"] == base["method"]
        assert r["speedup_same_cores"] == pytest.approx(r["tokens_per_second"] / base["tokens_per_second"])
        parts = sum(r[f"{k}_ms_per_token"] for k in ("target", "draft", "slim", "overhead"))
        assert parts == pytest.approx(r["ms_per_token"]) and r["ms_per_token"] == pytest.approx(
            1000 / r["tokens_per_second"]
        )
    assert sum(r["cpu_seconds"] for r in cores_run.records) > 0
    sd = by[("sd", "1")]
    assert sd["draft_ms_per_token"] > 0 and sd["speedup_bound_no_overhead"] > sd["speedup_same_cores"]
    assert by[("ar", "1")]["draft_ms_per_token"] == 0.0
    assert torch.get_num_threads() == 1  # every method's threads were restored after it ran


def test_cpu_model_and_instruction_set_in_meta_and_title(cores_run):
    from viasd_adapters.hardware import cpu_info

    meta = json.loads((cores_run.out_dir / "meta.json").read_text())
    info = cpu_info()
    assert meta["machine"]["cpu"]["model"] == info.model and meta["machine"]["cpu"]["isa"] == list(info.isa)
    assert meta["machine"]["method_threads"] == {"ar": None, "ar-2t": 2, "sd": None, "sd-2t": 2}
    title = cores_run.table.splitlines()[0]
    assert info.model in title and info.isa_label in title
    rows = {row["method"]: row for row in parse_table(cores_run.table, "All prompts")}
    assert rows["sd-2t"]["cores"] == "2" and rows["ar"]["cores"] == "1"
    assert "### Cost per generated token" in cores_run.table


def test_pearl_counts_its_draft_worker_in_its_cores():
    from viasd_adapters.pipeline import build_decoder, load_pair

    cfg = compose_bench("model_pair=tiny-random", "method=[pearl]")
    decoder = build_decoder(cfg.method.pearl.framework, cfg.method.pearl.verifier, load_pair(cfg.model_pair))
    assert decoder.cores(threads=2) == 2  # 1 verifier thread + 1 drafter thread (the config's)
    decoder.config.target_threads = None
    assert decoder.cores(threads=2) == 3


def test_cpu_time_includes_child_processes():
    import subprocess
    import sys

    from viasd_adapters.bench.resources import ResourceProbe

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.65: pass\nprint(flush=True)\ntime.sleep(60)"
    probe = ResourceProbe()
    probe.start()
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the child has burnt its 0.65 s of CPU and sleeps, still alive
        record = probe.stop()
    finally:
        child.kill()
        child.wait()
    # this process waited: most of the CPU time is the child's (counted in ticks, a little under 0.65)
    assert record["cpu_seconds"] >= 0.6


def test_a_sharded_run_cut_mid_prompt_resumes_where_it_stopped(tmp_path, monkeypatch):
    """Two shards of one sweep; the first is cut (an exception, as a preempted machine) after its
    first prompt and half of its second, then resumed: it keeps the whole prompt, runs the rest
    once, and the two shards together hold every prompt exactly once."""
    from viasd_adapters.bench.harness import Harness

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))

    def cfg(shard, *extra):
        return compose_bench(
            "model_pair=tiny-random", "runtime.weights=float32", "method=[ar,sd]", "task=jsonl",
            f"task.prompts_file={prompts}", "repetitions=1", "max_new_tokens=4", "plots=false", "progress=false",
            f"shard={shard}", "shards=2", f"out_dir={tmp_path / f'shard{shard}'}", *extra,
        )  # fmt: skip

    generate, calls = Harness._generate, []

    def cut_after_three(self, method, ids, sampling):
        calls.append(method.name)
        if len(calls) > 3:
            raise RuntimeError("preempted")
        return generate(self, method, ids, sampling)

    monkeypatch.setattr(Harness, "_generate", cut_after_three)
    with pytest.raises(RuntimeError, match="preempted"):
        run(cfg(0, "warmup=0"))
    cut = read_records(tmp_path / "shard0")
    assert [r["prompt_id"] for r in cut] == ["1", "1"]  # the whole first prompt; the second was cut
    with (tmp_path / "shard0" / "records.jsonl").open("a") as f:
        f.write(json.dumps(cut[0]).replace('"1"', '"3"') + '\n{"prompt_id": "3", "re')  # a group cut mid-write
    monkeypatch.setattr(Harness, "_generate", generate)
    with pytest.raises(ValueError, match="resume=true to continue"):
        run(cfg(0, "warmup=0"))
    with pytest.raises(ValueError, match="max_new_tokens differ"):
        run(cfg(0, "warmup=0", "resume=true", "max_new_tokens=5"))
    resumed = run(cfg(0, "warmup=0", "resume=true")).records
    assert read_records(tmp_path / "shard0") == resumed and resumed[:2] == cut  # kept as written
    other = run(cfg(1)).records
    ids = [r["prompt_id"] for r in resumed + other]
    assert Counter(ids) == {"1": 2, "2": 2, "3": 2, "4": 2}  # every prompt once per method, over both shards
    assert {r["prompt_id"] for r in resumed} == {"1", "3"}  # shard 0 of 2: prompts 0 and 2
    # a kept prompt after one that runs again (its records lost) is still skipped
    path = tmp_path / "shard1" / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in other if r["prompt_id"] == "4"))
    again = run(cfg(1, "resume=true")).records
    assert Counter(r["prompt_id"] for r in again) == {"2": 2, "4": 2}
    with pytest.raises(ValueError, match="shard < shards"):
        run(cfg(2))
