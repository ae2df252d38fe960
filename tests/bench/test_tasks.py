"""Prompt files: validation with clear errors, category selection and budgets."""

import json

import pytest

from viasd_adapters.bench.tasks import HumanEvalTask, JsonlTask, read_prompts_file, resolve_path

SPEC_BENCH = "../shared/data/spec_bench/question.jsonl"


def write(tmp_path, rows, name="prompts.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def row(qid, category="qa", **kw):
    return {"question_id": qid, "category": category, "turns": [f"question {qid}?"], **kw}


def test_unknown_field_is_named_with_its_line(tmp_path):
    path = write(tmp_path, [row(1), row(2, answer="x")])
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: unknown field\(s\) \['answer'\]"):
        read_prompts_file(path)


def test_missing_turns_is_named_with_its_line(tmp_path):
    path = write(tmp_path, [{"question_id": 1, "category": "qa"}])
    with pytest.raises(ValueError, match=r"prompts.jsonl:1: missing required field\(s\) \['turns'\]"):
        read_prompts_file(path)


@pytest.mark.parametrize(
    "bad, message",
    [
        (row(1, turns=[]), "non-empty list"),
        (row(1, turns="just a string"), "non-empty list"),
        (row(1, reference=3), "`reference` must be"),
        (row(1, category=""), "`category` must be"),
    ],
)
def test_malformed_fields(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        read_prompts_file(write(tmp_path, [bad]))


def test_bad_json_duplicate_ids_and_missing_file(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"question_id": 1,\n')
    with pytest.raises(ValueError, match="broken.jsonl:1: not valid JSON"):
        read_prompts_file(tmp_path / "broken.jsonl")
    with pytest.raises(ValueError, match="appears twice"):
        read_prompts_file(write(tmp_path, [row(1), row(1)]))
    with pytest.raises(ValueError, match="task.prompts_file=PATH"):
        read_prompts_file(tmp_path / "nope.jsonl")


def test_categories_limit_and_category_map(tmp_path):
    rows = [row(1, "writing"), row(2, "qa"), row(3, "roleplay", reference=["r3", "r3b"]), row(4, "qa"), row(5, "qa")]
    task = JsonlTask("t", write(tmp_path, rows), limit=2, category_map={"writing": "mt", "roleplay": "mt"})
    prompts = task.prompts()
    assert [(p.id, p.category, p.subcategory) for p in prompts] == [
        ("1", "mt", "writing"), ("3", "mt", "roleplay"), ("2", "qa", None), ("4", "qa", None)
    ]
    assert prompts[1].reference == "r3"  # the first turn's reference
    only_qa = JsonlTask("t", write(tmp_path, rows), categories=["qa"], limit=None).prompts()
    assert [p.id for p in only_qa] == ["2", "4", "5"]
    with pytest.raises(ValueError, match="not in the prompts"):
        JsonlTask("t", write(tmp_path, rows), categories=["math"]).prompts()
    with pytest.raises(ValueError, match="unknown quality metric"):
        JsonlTask("t", "x", metrics={"qa": "f1"})


@pytest.mark.skipif(not resolve_path(SPEC_BENCH).exists(), reason="Spec-Bench data not present")
def test_spec_bench_file_loads_with_the_shipped_config_shape():
    task = JsonlTask(
        "spec_bench", SPEC_BENCH, limit=1,
        category_map={c: "mt_bench" for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")},
    )
    assert [p.category for p in task.prompts()] == ["mt_bench", "translation", "summarization", "qa", "math_reasoning"]


def test_humaneval_prompts_come_from_the_package():
    prompts = HumanEvalTask(limit=3).prompts()
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in prompts[0].text and "```python" in prompts[0].text
    assert HumanEvalTask(execute_code=False).metric_for("humaneval") is None
