"""Quality metrics and agreement on hand-made inputs."""

import pytest

from viasd_adapters.bench.metrics import (
    answer_match,
    bleu,
    check_execution_enabled,
    extract_answer,
    extract_code,
    humaneval_completion,
    math_accuracy,
    normalize_answer,
    pass_at_1,
    rouge_l,
    token_agreement,
)
from viasd_adapters.bench.tasks import HumanEvalTask, Prompt


def prompt(reference, category="x"):
    return Prompt(id="1", category=category, text="q", reference=reference)


@pytest.mark.parametrize(
    "tokens, reference, match, exact",
    [
        ([1, 2, 3], [1, 2, 3], 1.0, True),
        ([1, 2, 3], [1, 9, 3], 2 / 3, False),
        ([1, 2], [1, 2, 3, 4], 1.0, False),  # a prefix: every compared position agrees
        ([5, 2, 3, 4], [1, 2], 0.5, False),  # up to the shorter length
        ([], [], 1.0, True),
        ([], [1], 0.0, False),
    ],
)
def test_token_agreement(tokens, reference, match, exact):
    assert token_agreement(tokens, reference) == (pytest.approx(match), exact)


def test_bleu_is_100_for_the_reference_and_low_for_unrelated_text():
    ref = prompt("Pawnbrokers shine in Singapore as middle class feel the pinch")
    assert bleu(ref, "Pawnbrokers shine in Singapore as middle class feel the pinch").value == pytest.approx(100)
    assert bleu(ref, "The cat sat on the mat.").value < 10
    assert bleu(prompt(None), "anything").value is None


def test_rouge_l_f1_by_hand():
    ref = prompt("the cat sat on the mat")
    assert rouge_l(ref, "the cat sat on the mat").value == pytest.approx(1.0)
    # LCS "the cat on the mat" = 5 tokens; P = 5/6, R = 5/6 -> F1 = 5/6
    assert rouge_l(ref, "the cat lay on the mat").value == pytest.approx(5 / 6)
    assert rouge_l(ref, "dogs bark").value == 0.0


@pytest.mark.parametrize(
    "text, answer",
    [
        ("So it cost 600+400=$<<600+400=1000>>1000 in total.\n#### 1000", 1000),
        ("The total is \\boxed{42}. Check: 40 + 2 = 42", 42),
        ("#### 1,250", 1250),
        ("The answer is $18. Later we note 3 more.", 18),
        ("Answer: -3.5 degrees, rounded from -3.49", -3.5),
        ("First 5 apples, then 7 pears, so 12 fruits", 12),
        ("no digits here", None),
    ],
)
def test_extract_answer_rules(text, answer):
    assert extract_answer(text) == answer


def test_math_accuracy_compares_extracted_answers():
    ref = prompt("He pays 400*.5=$<<400*.5=200>>200 more\n#### 1000")
    assert math_accuracy(ref, "Supplies 400, tickets 600, total $1,000.").value == 1.0
    assert math_accuracy(ref, "The total is 1000.00").value == 1.0
    assert math_accuracy(ref, "The answer is 600, not 1000").value == 0.0  # "answer is" wins
    assert math_accuracy(ref, "I don't know").value == 0.0
    assert math_accuracy(prompt(None), "1000").value is None


def test_extract_code_takes_the_first_fenced_block_even_unclosed():
    assert extract_code("Here:\n```python\nx = 1\n```\nand ```python\ny = 2\n```") == "x = 1\n"
    assert extract_code("```\nz = 3\n") == "z = 3\n"  # truncated by the token budget
    assert extract_code("    return 1\n") == "    return 1\n"


@pytest.fixture(scope="module")
def humaneval_0():
    return HumanEvalTask(limit=1, timeout_s=3.0).prompts()[0]


def test_humaneval_execution_is_really_enabled():
    check_execution_enabled()  # raises if a known-wrong completion would pass


def test_humaneval_pass_at_1_known_correct_and_known_wrong(humaneval_0):
    problem = humaneval_0.data["problem"]
    whole_function = f"Sure!\n```python\n{problem['prompt']}{problem['canonical_solution']}```\nDone."
    assert humaneval_completion(problem, whole_function).startswith("\nfrom typing import List")
    assert pass_at_1(humaneval_0, whole_function).value == 1.0
    assert pass_at_1(humaneval_0, problem["canonical_solution"]).value == 1.0  # a bare body
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    score = pass_at_1(humaneval_0, wrong)
    assert score.value == 0.0 and score.detail.startswith("failed")
    assert pass_at_1(humaneval_0, "```python\ndef has_close_elements(\n").value == 0.0  # syntax error


@pytest.mark.parametrize(
    "answers, text, value",
    [
        (["Port Allen"], "It reaches the sea at port allen.", 1.0),  # case and punctuation
        (["the Pacific"], "Pacific Ocean", 1.0),  # articles dropped on both sides
        (["2 hours and 40 minutes", "160 minutes"], "About 160 minutes.", 1.0),  # any acceptable answer
        (["8"], "Spiders have 18 legs? No.", 0.0),  # whole words only
        (["Canberra"], "Sydney is the largest city.", 0.0),
    ],
)
def test_answer_match(answers, text, value):
    score = answer_match(prompt(answers), text)
    assert score.value == value, score.detail


def test_answer_match_and_bleu_take_a_single_reference_too():
    assert answer_match(prompt("Canberra"), "It is Canberra.").value == 1.0
    assert answer_match(prompt(None), "x").value is None
    assert bleu(
        prompt(["unrelated words here", "the cat sat on the mat"]), "the cat sat on the mat"
    ).value == pytest.approx(100.0)
    assert rouge_l(prompt(["nothing in common", "a b c d"]), "a b c d").value == pytest.approx(1.0)
    assert normalize_answer("The  Cat, sat!") == "cat sat"
