"""The automatic choice: target dtype, drafter variant, K and threads by the profile's costs."""

import pytest

from viasd_adapters.costs import (
    DraftVariant,
    EagleCandidate,
    LatencyEntry,
    LatencyProfile,
    choose_configuration,
    draft_head_key,
)
from viasd_adapters.decode import RankAcceptance

from .profiles import AMD, INTEL, D, T, profile_of


def test_the_intel_profile_chooses_sd_in_bf16_and_the_amd_one_greedy_ar():
    intel = choose_configuration(INTEL, D, T, acceptance=0.8, threads=2)
    assert (intel.framework, intel.dtype, intel.draft_dtype) == ("sd", "bfloat16", "bfloat16")
    assert intel.num_draft_tokens >= 2 and intel.expected_speedup > 1.1
    assert intel.expected_tokens_per_second == pytest.approx(intel.expected_speedup * 1000 / 216)
    amd = choose_configuration(AMD, D, T, acceptance=0.8, threads=2)
    assert (amd.framework, amd.dtype, amd.num_draft_tokens) == ("ar", "bfloat16", 0)
    assert "no draft length is predicted to beat it" in amd.describe()
    margin = choose_configuration(INTEL, D, T, acceptance=0.8, threads=2, min_speedup=intel.expected_speedup + 0.01)
    assert margin.framework == "ar"  # a speculative option under the margin is not chosen
    assert choose_configuration(INTEL, D, T, acceptance=0.8, threads=2, min_speedup=intel.expected_speedup) == intel
    with pytest.raises(ValueError, match="run viasd-profile"):
        choose_configuration(INTEL, D, T, acceptance=0.8, threads=1)


def test_a_drafter_over_a_draft_vocabulary_is_chosen_where_its_cheaper_step_outweighs_its_acceptance():
    # the Zen 5's AVX2 shape: the 0.5B's step with its 32k draft head 11.1 ms against 14.4 with the full one
    reduced = "int8@qwen2.5-coder-0.5b-instruct-32768"
    p = profile_of({(T, "int8"): {1: 40.3, 2: 43.5, 4: 48.2, 8: 77.7}, (D, "int8"): {1: 14.4}, (D, reduced): {1: 11.1}})
    variants = ["int8", reduced]
    same = choose_configuration(p, D, T, acceptance=0.88, threads=2, dtypes=["int8"], draft_dtypes=variants)
    assert (same.framework, same.draft_dtype, same.acceptance) == ("sd", reduced, 0.88)
    assert "over the draft vocabulary qwen2.5-coder-0.5b-instruct-32768" in same.describe()
    lower = choose_configuration(
        p,
        D,
        T,
        acceptance=0.88,
        threads=2,
        dtypes=["int8"],
        draft_dtypes=variants,
        variant_acceptance={"vocabulary": 0.7},
    )
    assert (lower.framework, lower.draft_dtype, lower.acceptance) == ("sd", "int8", 0.88)
    alone = choose_configuration(
        p,
        D,
        T,
        acceptance=0.88,
        threads=2,
        dtypes=["int8"],
        draft_dtypes=[reduced],
        variant_acceptance={"vocabulary": 0.7},
    )
    assert alone.acceptance == 0.7 and alone.expected_speedup < same.expected_speedup  # priced at its own a


def test_a_speedup_is_over_the_fastest_ar_not_ar_in_the_chosen_dtype():
    # fp32 verifies cheaply here but steps slower than bf16: the fp32 SD choice must be priced
    # against bf16 AR (200 ms), not against fp32 AR (300 ms).
    p = profile_of({(T, "bfloat16"): {1: 200, 2: 400}, (D, "bfloat16"): {1: 20}, (T, "float32"): {1: 300, 2: 300}})
    choice = choose_configuration(p, D, T, acceptance=0.9, threads=2, draft_dtypes=["bfloat16"], k_max=1)
    assert (choice.framework, choice.dtype) == ("sd", "float32")
    assert choice.ar_tokens_per_second == pytest.approx(5.0)
    assert choice.expected_speedup == pytest.approx(choice.expected_tokens_per_second / 5.0)


def test_on_an_avx2_cpu_the_flat_int8_target_makes_sd_the_choice():
    """The AVX2 shape (measured, docs/results/int8.md): bf16 and fp32 verifies grow with rows, int8's barely."""
    p = profile_of(
        {
            (T, "bfloat16"): {1: 112, 4: 438, 8: 833},
            (T, "float32"): {1: 393, 4: 762, 8: 736},
            (T, "int8"): {1: 74, 4: 120, 8: 159},
            (D, "bfloat16"): {1: 42},
            (D, "int8"): {1: 20},
        }
    )
    choice = choose_configuration(p, D, T, acceptance=0.8, threads=2, dtypes=["int8", "bfloat16", "float32"])
    assert (choice.framework, choice.dtype, choice.draft_dtype) == ("sd", "int8", "int8")
    assert choice.fastest_ar_dtype == "int8" and choice.expected_speedup > 1.2
    bf16_only = choose_configuration(p, D, T, acceptance=0.8, threads=2, dtypes=["bfloat16"])
    assert (bf16_only.framework, bf16_only.fastest_ar_dtype) == ("ar", "bfloat16")


def test_the_choice_takes_the_faster_thread_count():
    # A busy host: two threads are slower than one (a 2-thread op waits for its slower thread).
    busy = LatencyProfile(
        entries=INTEL.entries
        + profile_of({(T, "bfloat16"): {1: 400, 8: 420, 16: 450}, (D, "bfloat16"): {1: 190}}, threads=1).entries
    )
    busy.entries = [
        e if e.threads == 1 else LatencyEntry(e.model, e.dtype, 2, e.context, e.new_tokens, e.ms * 3)
        for e in busy.entries
    ]
    choice = choose_configuration(busy, D, T, acceptance=0.8, threads=[1, 2])
    assert choice.threads == 1 and choice.dtype == "bfloat16"


def test_a_cheaper_quantised_drafter_wins_the_choice_when_the_profile_has_it():
    int8 = "bfloat16+int8-weight"
    p = profile_of({(T, "bfloat16"): {1: 216, 8: 223, 16: 242}, (D, "bfloat16"): {1: 101}, (D, int8): {1: 50}})
    choice = choose_configuration(
        p, D, T, acceptance=0.7, threads=2, dtypes=["bfloat16"], draft_dtypes=["bfloat16", int8]
    )
    plain = choose_configuration(p, D, T, acceptance=0.7, threads=2, dtypes=["bfloat16"])
    assert choice.draft_dtype == int8 and plain.draft_dtype == "bfloat16"
    assert choice.expected_speedup > plain.expected_speedup
    assert int8 in choice.describe()


def test_a_precision_whose_step_is_over_1_by_1_minus_a_fastest_steps_is_never_chosen():
    from viasd_adapters.costs import winnable_dtypes

    # at a = 0.6 a round commits < 2.5 tokens: 250 ms is the ceiling over the 100 ms int8 step
    profile = profile_of(
        {
            (T, "int8"): {1: 100, 8: 220},
            (T, "bfloat16"): {1: 240, 8: 250},
            (T, "float32"): {1: 260, 8: 260},  # verifies as cheap as a step: still out of reach
            (D, "int8"): {1: 0.001},  # a free draft
        }
    )
    dtypes = ["int8", "bfloat16", "float32", "float16"]
    assert winnable_dtypes(profile, T, dtypes, 0.6, threads=2, context=128) == ["int8", "bfloat16", "float16"]
    assert winnable_dtypes(profile, T, dtypes, 0.7, threads=2, context=128) == dtypes  # 1 / 0.3: 333 ms
    for a in (0.6, 0.65):  # the bound is one the choice itself respects, with every forward priced
        choice = choose_configuration(profile, D, T, a, 2, dtypes=dtypes[:3], draft_dtypes=["int8"], context=128)
        assert choice.dtype != "float32"


def _eagle(rate: float) -> EagleCandidate:
    """A head whose drafts the target takes at `rate` for its top guess, at every depth (rank 1: a tenth)."""
    ranks = RankAcceptance()
    for depth in range(1, 6):
        ranks.offered[depth, 0] = ranks.offered[depth, 1] = 1000
        ranks.taken[depth, 0], ranks.taken[depth, 1] = int(1000 * rate), 100
    return EagleCandidate(draft_head_key(T, "head"), "head", ranks)


def test_an_eagle_head_that_drafts_cheaply_and_well_is_chosen_with_a_tree_the_profile_measured():
    int8 = {1: 60.0, 2: 70.0, 4: 76.0, 8: 110.0}
    profile = profile_of(
        {(T, "int8"): int8, (D, "int8"): {1: 35.0}, (draft_head_key(T, "head"), "int8"): {1: 3.0, 8: 4.0}}
    )
    choice = choose_configuration(profile, D, T, 0.88, 2, dtypes=["int8"], eagle=_eagle(0.8), min_speedup=1.1)
    assert choice.framework == "eagle" and choice.head == "head"
    assert 1 <= len(choice.tree) <= 7  # verifies at most the 8 rows the profile measured
    assert choice.expected_speedup > 1.5
    # the same head at a tenth of a target step per level and a poor top guess: SD or AR wins
    dear = profile_of(
        {(T, "int8"): int8, (D, "int8"): {1: 35.0}, (draft_head_key(T, "head"), "int8"): {1: 30.0, 8: 40.0}}
    )
    other = choose_configuration(dear, D, T, 0.88, 2, dtypes=["int8"], eagle=_eagle(0.3), min_speedup=1.1)
    assert other.framework != "eagle"
    assert "EAGLE (head), target int8" in choice.describe()


def test_eagle_is_not_considered_where_the_profile_lacks_its_head():
    profile = profile_of({(T, "int8"): {1: 60.0, 8: 110.0}, (D, "int8"): {1: 35.0}})
    choice = choose_configuration(profile, D, T, 0.88, 2, dtypes=["int8"], eagle=_eagle(0.9))
    assert choice.framework in ("sd", "ar")


def test_each_drafter_variant_is_priced_at_its_own_acceptance():
    four_bit, both = "int8+int4", "int8+int4@qwen2.5-coder-0.5b-instruct-32768"
    given = {"vocabulary": 0.8, "int4": 0.84, "int4+vocabulary": 0.78}
    assert DraftVariant.parse(four_bit).acceptance(0.86, given) == 0.84
    assert DraftVariant.parse(both).acceptance(0.86, given) == 0.78
    assert DraftVariant.parse("int8@qwen2.5-coder-0.5b-instruct-32768").acceptance(0.86, given) == 0.8
    assert DraftVariant.parse("bfloat16+int8-weight").acceptance(0.86, given) == 0.86  # rounds as the plain draft
    assert DraftVariant.parse(both).acceptance(0.86, {"vocabulary": 0.8}) == 0.8  # the nearest stated
    assert DraftVariant.parse(four_bit).acceptance(0.86, None) == 0.86
    # the 4-bit draft's cheaper step against its lower acceptance
    p = profile_of({(T, "int8"): {1: 40.0, 2: 43.0, 4: 48.0, 8: 78.0}, (D, "int8"): {1: 14.0}, (D, four_bit): {1: 9.0}})
    options = dict(acceptance=0.86, threads=2, dtypes=["int8"], draft_dtypes=["int8", four_bit])
    assert choose_configuration(p, D, T, **options, variant_acceptance={"int4": 0.84}).draft_dtype == four_bit
    assert choose_configuration(p, D, T, **options, variant_acceptance={"int4": 0.5}).draft_dtype == "int8"
