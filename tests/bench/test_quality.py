"""Paired quality of benchmark runs (viasd_adapters.bench.quality), on records written here."""

import json

import pytest

from viasd_adapters.bench.quality import load_records, main, merge_runs, paired_quality, run_quality


def _run(tmp_path, name, rows):
    """A run directory whose baseline `ar` scored `rows`: (category, metric, quality, tokens, new, budget)."""
    folder = tmp_path / name
    folder.mkdir()
    records = [
        {
            "rep": 0,
            "method": "ar",
            "baseline": "ar",
            "category": c,
            "prompt_id": str(i),
            "quality_metric": m,
            "quality": q,
            "output_tokens": t,
            "new_tokens": n,
            "max_new_tokens": budget,
        }
        for i, (c, m, q, t, n, budget) in enumerate(rows)
    ]
    records.append({**records[0], "rep": 1, "quality": 1 - records[0]["quality"]})  # only repetition 0 counts
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_binary_metrics_get_wilson_intervals_and_mcnemar_counts(tmp_path):
    # 20 math prompts: the reference gets 15 right; the run gets 10 of those and 1 the reference missed
    ref = [1] * 15 + [0] * 5
    new = [1] * 10 + [0] * 5 + [1] + [0] * 4
    a = _run(tmp_path, "a", [("math", "math_accuracy", q, [1, 2, 3], 3, 8) for q in new])
    b = _run(
        tmp_path,
        "b",
        [
            ("math", "math_accuracy", q, [1, 2, 4] if i < 10 else [1, 2, 3], 8 if i == 0 else 3, 8)
            for i, q in enumerate(ref)
        ],
    )
    runs = {"a": load_records(a), "b": load_records(b)}
    by_run = {q.run: q for q in run_quality(runs)}
    assert by_run["b"].n == 20 and by_run["b"].mean == 0.75 and by_run["b"].cut == 1
    assert by_run["b"].low == pytest.approx(0.531, abs=1e-3) and by_run["b"].high == pytest.approx(0.888, abs=1e-3)
    (paired,) = paired_quality(runs, "b")
    assert (paired.only_run, paired.only_reference) == (1, 5)
    assert paired.difference == pytest.approx(11 / 20 - 15 / 20)
    assert paired.p_value == pytest.approx(2 * 7 / 64)  # two-sided exact binomial, 1 of 6 discordant
    assert paired.identical == 10 and paired.token_match == pytest.approx((10 * 1.0 + 10 * 2 / 3) / 20)


def test_continuous_metrics_pair_by_prompt(tmp_path):
    a = _run(tmp_path, "a", [("translation", "bleu", q, [1], 1, 8) for q in (1.0, 2.0, 3.0)])
    b = _run(tmp_path, "b", [("translation", "bleu", q, [1], 1, 8) for q in (0.0, 1.0, 1.0)])
    (paired,) = paired_quality({"a": load_records(a), "b": load_records(b)}, "b")
    assert paired.difference == pytest.approx(4 / 3)
    # paired bootstrap of the differences (1, 1, 2): a resample's mean is 1 with probability
    # (2/3)^3 = 0.30 and 2 with (1/3)^3 = 0.037, so both 2.5 % tails sit on those values
    assert (paired.low, paired.high) == (1.0, 2.0)
    assert paired.drop_bound == -1.0  # the run is better on every prompt: no drop to bound
    assert paired.p_value == pytest.approx(0.0572, abs=1e-3)  # the paired t test, t = 4, 2 df
    assert paired.only_run is None


def test_bad_run_directories_are_named(tmp_path):
    with pytest.raises(ValueError, match="records.jsonl does not exist"):
        load_records(tmp_path)
    a = _run(tmp_path, "a", [("math", "math_accuracy", 1, [1], 1, 8)])
    with pytest.raises(ValueError, match="reference run 'c' is not among"):
        main([f"a={a}", "--reference", "c"])


def test_the_command_writes_its_tables(tmp_path, capsys):
    a = _run(tmp_path, "a", [("math", "math_accuracy", 1, [1], 1, 8)])
    b = _run(tmp_path, "b", [("math", "math_accuracy", 0, [2], 1, 8)])
    main([f"int8={a}", f"bfloat16={b}", "--reference", "bfloat16", "--out", str(tmp_path / "out")])
    assert "int8 - bfloat16" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out" / "quality.json").read_text())
    assert saved["paired"][0]["only_run"] == 1


def test_batched_task_answers_are_scored_and_compared(tmp_path):
    """tools/task_quality.py on the tiny model: every prompt answered within the budget and scored."""
    import runpy
    from pathlib import Path

    tool = runpy.run_path(str(Path(__file__).parents[2] / "tools" / "task_quality.py"))
    tool["main"](
        [
            "model_pair=tiny-random",
            "runtime.weights=float32",
            "task.limit=1",
            "max_new_tokens=6",
            f"out_dir={tmp_path}",
            "batch_size=3",
        ]
    )
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 7  # one prompt of each shipped category
    scored = load_records(tmp_path)
    assert {c for c, _ in scored} == {"math_reasoning", "qa", "rag", "summarization", "translation"}
    assert all(1 <= r["new_tokens"] <= 6 and len(r["output_tokens"]) == r["new_tokens"] for r in scored.values())


def test_the_drop_bound_at_80_problems_with_a_tenth_discordant_is_about_six_points():
    """The issue's power figure: 80 problems, 4 won and 4 lost each way (no drop), bound the drop
    at about 5.8 points one-sided (normal approximation: 1.645 * sqrt(0.1 / 80))."""
    from viasd_adapters.bench.quality import paired_bootstrap

    run = [1] * 4 + [0] * 4 + [1] * 36 + [0] * 36
    reference = [0] * 4 + [1] * 4 + [1] * 36 + [0] * 36
    low, high = paired_bootstrap(run, reference, confidence=0.90)
    assert -0.07 < low < -0.045 and 0.045 < high < 0.07
    assert paired_bootstrap(run, reference, confidence=0.90) == (low, high)  # seeded: reproducible
    assert paired_bootstrap([0.5, 0.7], [0.5, 0.7]) == (0.0, 0.0)  # no spread: the difference itself


def test_noninferiority_power_and_verdicts_on_known_inputs(tmp_path):
    from viasd_adapters.bench.quality import noninferiority_power

    # The bound at 80 problems, a tenth discordant, is 5.8 points: a 5.8-point margin has even odds
    assert noninferiority_power(80, 0.1**0.5, 1.645 * (0.1 / 80) ** 0.5) == pytest.approx(0.5, abs=1e-3)
    assert noninferiority_power(164, 0.1**0.5, 0.05) == pytest.approx(0.649, abs=1e-3)
    assert noninferiority_power(80, 0.1**0.5, 0.05, true_drop=0.05) == pytest.approx(0.05)  # the test's size
    assert noninferiority_power(10, 0.0, 0.05) == 1.0 and noninferiority_power(10, 0.0, 0.05, true_drop=0.1) == 0.0
    with pytest.raises(ValueError, match="n >= 1"):
        noninferiority_power(0, 0.3, 0.05)
    # 20 math prompts, the run loses 5 and wins 1: a 45-point margin keeps it, 5 points is not
    ref = [1] * 15 + [0] * 5
    new = [1] * 10 + [0] * 5 + [1] + [0] * 4
    a = _run(tmp_path, "a", [("math", "math_accuracy", q, [1], 1, 8) for q in new])
    b = _run(tmp_path, "b", [("math", "math_accuracy", q, [1], 1, 8) for q in ref])
    runs = {"a": load_records(a), "b": load_records(b)}
    (strict,) = paired_quality(runs, "b")  # the default margin: 5 points
    (loose,) = paired_quality(runs, "b", {"math_accuracy": 0.45})
    assert strict.margin == 0.05 and strict.non_inferior is False
    assert 0.3 < loose.drop_bound < 0.45 and loose.non_inferior is True
    (unjudged,) = paired_quality(runs, "b", {})
    assert unjudged.non_inferior is None


def test_a_powered_frontier_job_is_scored_by_method_beside_the_screen_s_speeds(tmp_path, capsys):
    """A viasd-frontier points job holds several points in one records file: --by-method scores
    each NAME's own records, and the screen's speeds go beside them by the same names."""
    job = tmp_path / "job"
    job.mkdir()
    scores = {"host": (1, 1, 1, 0), "via-sd[8l]@0.9/0.9": (1, 0, 1, 0)}
    records = [
        {"rep": 0, "method": m, "baseline": "host", "category": "math_reasoning", "prompt_id": str(i),
         "quality_metric": "math_accuracy", "quality": q, "output_tokens": [i], "new_tokens": 1, "max_new_tokens": 8}
        for m, qs in scores.items() for i, q in enumerate(qs)
    ]  # fmt: skip
    (job / "records-math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    screen = tmp_path / "screen"
    screen.mkdir()
    points = [{"name": "host", "speedup_vs_host": 1.0}, {"name": "via-sd[8l]@0.9/0.9", "speedup_vs_host": 0.78}]
    (screen / "frontier.json").write_text(json.dumps({"points": points}))
    out = tmp_path / "out"
    main([f"host={job}", f"via-sd[8l]@0.9/0.9={job}", "--reference", "host", "--by-method", "--out", str(out),
          "--screen", str(screen)])  # fmt: skip
    means = {r["run"]: r["mean"] for r in json.loads((out / "quality.json").read_text())["runs"]}
    assert means == {"host": 0.75, "via-sd[8l]@0.9/0.9": 0.5}
    assert (out / "speed_quality.png").stat().st_size > 0
    with pytest.raises(ValueError, match="frontier.json does not exist"):
        main([f"host={job}", "--reference", "host", "--by-method", "--out", str(out), "--screen", str(tmp_path)])
    with pytest.raises(SystemExit):
        main([f"host={job}", "--reference", "host", "--by-method", "--method", "host"])
    assert "drop --method" in capsys.readouterr().err


def test_a_rerun_of_cut_answers_replaces_them_and_pairs_only_equal_budgets(tmp_path):
    first = load_records(_run(tmp_path, "first", [("math_reasoning", "math_accuracy", 0.0, [1, 2], 2, 2)] * 3))
    rerun = load_records(_run(tmp_path, "rerun", [("math_reasoning", "math_accuracy", 1.0, [1, 2, 3], 3, 4)]))
    merged = merge_runs([first, rerun])
    assert [(k[1], r["quality"], r["max_new_tokens"]) for k, r in sorted(merged.items())] == [
        ("0", 1.0, 4),
        ("1", 0.0, 2),
        ("2", 0.0, 2),
    ]
    (row,) = paired_quality({"host": merged, "point": merged}, "host")
    assert row.n == 3
    with pytest.raises(ValueError, match=r"decoded prompts \['0'\] with different max_new_tokens"):
        paired_quality({"host": merged, "point": first}, "host")
