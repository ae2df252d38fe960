"""Prompt files: validation with clear errors, category selection and budgets."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from viasd_adapters.bench.metrics import QUALITY_METRICS
from viasd_adapters.bench.tasks import HumanEvalTask, JsonlTask, read_prompts_file, resolve_path
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.prompts import DEFAULT, PROMPTS_DIR

# Spec-Bench's question.jsonl, where VIASD_SPEC_BENCH names a copy (tests only; the package never needs it).
SPEC_BENCH = os.environ.get("VIASD_SPEC_BENCH") if Path(os.environ.get("VIASD_SPEC_BENCH", "")).is_file() else None


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
        (row(1, reference=[["ok"], [3]]), "`reference` must be"),
        (row(1, reference=[{"a": 1}]), "`reference` must be"),
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
    with pytest.raises(ValueError, match=r"nope.jsonl' does not exist: set some.key=PATH"):
        read_prompts_file(tmp_path / "nope.jsonl", "some.key")
    with pytest.raises(ValueError, match=r"does not exist \(relative to the working directory .*set task.prompts_file"):
        JsonlTask("t", "no/such/file.jsonl").prompts()  # the task names its own key
    with pytest.raises(ValueError, match="no installed module"):
        read_prompts_file("pkg://no_such_module_xyz/p.jsonl")


def test_categories_limit_and_category_map(tmp_path):
    rows = [row(1, "writing"), row(2, "qa"), row(3, "roleplay", reference=["r3", "r3b"]), row(4, "qa"), row(5, "qa")]
    task = JsonlTask("t", write(tmp_path, rows), limit=2, category_map={"writing": "mt", "roleplay": "mt"})
    prompts = task.prompts()
    assert [(p.id, p.category, p.subcategory) for p in prompts] == [
        ("1", "mt", "writing"),
        ("3", "mt", "roleplay"),
        ("2", "qa", None),
        ("4", "qa", None),
    ]
    assert prompts[1].reference == "r3"  # the first turn's reference
    only_qa = JsonlTask("t", write(tmp_path, rows), categories=["qa"], limit=None).prompts()
    assert [p.id for p in only_qa] == ["2", "4", "5"]
    with pytest.raises(ValueError, match="not in the prompts"):
        JsonlTask("t", write(tmp_path, rows), categories=["math"]).prompts()
    with pytest.raises(ValueError, match="unknown quality metric"):
        JsonlTask("t", "x", metrics={"qa": "f1"})


def rag_rows(first_id: int, count: int) -> list[dict]:
    """RAG rows as Spec-Bench writes them: `reference` holds, per turn, a list of acceptable answers."""
    return [
        {
            "question_id": first_id + i,
            "category": "rag",
            "turns": [f"Passage: The tower in town {i} is {i + 20} metres tall.\nQuestion: How tall is the tower?"],
            "reference": [[f"{i + 20} metres", f"{i + 20} m"]],
        }
        for i in range(count)
    ]


def test_rag_rows_load_and_keep_their_acceptable_answers(tmp_path):
    path = write(tmp_path, [row(1, "qa")] + rag_rows(2, 2) + [row(9, "translation", reference=["gold"])])
    prompts = JsonlTask("t", path, metrics={"rag": "answer_match"}).prompts()
    assert [p.reference for p in prompts] == [None, ["20 metres", "20 m"], ["21 metres", "21 m"], "gold"]
    score = QUALITY_METRICS["answer_match"]
    assert score(prompts[1], "It is 20 m tall.").value == 1.0
    assert score(prompts[1], "It is 120 m tall.").value == 0.0  # whole words only
    assert score(prompts[0], "anything").value is None  # no reference: not scored


SPEC_BENCH_TASK = dict(
    category_map={
        c: "mt_bench"
        for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    },
    metrics={
        "translation": "bleu",
        "summarization": "rouge_l",
        "math_reasoning": "math_accuracy",
        "rag": "answer_match",
    },
)


@pytest.mark.skipif(SPEC_BENCH is None, reason="no copy of Spec-Bench's question.jsonl here")
def test_spec_bench_question_file_with_all_480_questions_loads(tmp_path):
    """Spec-Bench's own file, unmodified, as the benchmark's task config reads it. The copy on this
    machine lacks the 80 RAG rows, so they are added in Spec-Bench's format (ids 1-80, which the
    copy leaves free) when missing."""
    lines = Path(SPEC_BENCH).read_text(encoding="utf-8").splitlines(keepends=True)
    rows = [json.loads(line) for line in lines]
    if not any(r["category"] == "rag" for r in rows):
        lines = [json.dumps(r) + "\n" for r in rag_rows(1, 80)] + lines
    path = tmp_path / "question.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    assert len(read_prompts_file(path)) == 480
    prompts = JsonlTask("spec_bench", str(path), **SPEC_BENCH_TASK).prompts()
    assert Counter(p.category for p in prompts) == {
        "mt_bench": 80,
        "translation": 80,
        "summarization": 80,
        "qa": 80,
        "math_reasoning": 80,
        "rag": 80,
    }
    rag = [p for p in prompts if p.category == "rag"]
    assert all(isinstance(p.reference, list) and p.reference for p in rag)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("bench", overrides=[f"task.prompts_file={path}", "task.limit=1"])
    task = instantiate(cfg.task, _convert_="all")  # the shipped task config, pointed at Spec-Bench
    assert [p.category for p in task.prompts()] == list(dict.fromkeys(p.category for p in prompts))  # one each
    assert task.metric_for("rag") == "answer_match"


def test_the_shipped_prompt_set_covers_the_categories_and_its_references_score_perfectly():
    assert resolve_path(DEFAULT) == PROMPTS_DIR / "default.jsonl"
    rows = read_prompts_file(DEFAULT)
    assert Counter(r["category"] for r in rows) == {
        c: 8 for c in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code")
    }
    assert all(len(r["turns"]) == 2 for r in rows if r["category"] == "mt_bench")  # multi-turn chat
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        task = instantiate(compose("bench").task, _convert_="all")  # the default benchmark task
    assert task.prompts_file == DEFAULT and task.limit == 1
    task.limit = None
    prompts = task.prompts()
    scored = {p.category for p in prompts if task.metric_for(p.category)}
    assert scored == {"translation", "summarization", "qa", "math_reasoning", "rag"}
    for p in prompts:
        metric = task.metric_for(p.category)
        if metric is None:
            continue
        assert p.reference, p.id
        answer = p.reference if isinstance(p.reference, str) else f"The answer: {p.reference[-1]}."
        best = 100.0 if metric == "bleu" else 1.0
        assert QUALITY_METRICS[metric](p, answer).value == pytest.approx(best), (p.id, metric)
    # RAG prompts hold the answer in one of their passages (so a faithful model can find it).
    for p in prompts:
        if p.category == "rag":
            assert any(a.lower() in p.text.lower() for a in p.reference), p.id


def test_humaneval_prompts_come_from_the_package():
    prompts = HumanEvalTask(limit=3).prompts()
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in prompts[0].text and "```python" in prompts[0].text
    assert HumanEvalTask(execute_code=False).metric_for("humaneval") is None
