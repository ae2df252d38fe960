"""PEARL: the engine's schedule on a toy drafter/target, worker shutdown, and the Decoder adapter
on tiny random models (greedy identity with AR, lossless sampling, VIA-SD's tiers inside)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import psutil
import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.conftest import exact_marginals, perturbed
from tests.decode.test_loops import N_SAMPLED, PROMPT, sampling_pair
from tests.verify.statistics import P_MIN, POWER, chi_square_p, chi_square_power, sample_counts, total_variation
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.decode import AutoregressiveDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.hosts.pearl import PearlDecoder
from viasd_adapters.pipeline import build_decoder, load_pair
from viasd_adapters.sampling import SamplingConfig
from viasd_adapters.third_party.pearl import DraftWorkerError, PearlConfig, PearlEngine
from viasd_adapters.third_party.pearl.testing import ToyJudge, ToyProposer, toy_reference
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, Tier, TieredVerifier, Verifier

TOY_PROMPT = torch.tensor([[3, 5, 7]])
SAMPLED = SamplingConfig(temperature=1.0, seed=11)


def toy_run(engine: PearlEngine, judge: ToyJudge, n: int, prompt=TOY_PROMPT):
    """Generate n toy tokens; returns (tokens, rounds)."""
    tokens, rounds = [], []
    with engine.session(prompt, judge) as session:
        while len(tokens) < n:
            round_ = session.step(n - len(tokens))
            tokens += round_.tokens.tolist()
            rounds.append(round_)
    return tokens, rounds


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` exits (or is a zombie nobody reaps) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------- the schedule (toy models)


TOY_CASES = [("thread", w) for w in (1, 2, 3, 6)] + [("process", 3)]


@pytest.mark.parametrize("schedule", ["window", "eager"])
@pytest.mark.parametrize("backend, window", TOY_CASES)
def test_toy_greedy_output_equals_the_target_alone(backend, window, schedule):
    config = PearlConfig(window_size=window, schedule=schedule, backend=backend, target_threads=None)
    # A drafter as fast as the target, so that both modes occur in both schedules.
    with PearlEngine(ToyProposer(error_every=4, sleep_s=0.002), config) as engine:
        judge = ToyJudge(sleep_s=0.004)
        tokens, rounds = toy_run(engine, judge, 50)
    assert tokens == toy_reference(TOY_PROMPT, 50, 50)
    assert max(judge.blocks) <= window  # a judged block is at most one window
    if window > 1 and schedule == "window":
        assert {r.mode for r in rounds} == {"pre", "post"}


def test_eager_drafter_stays_within_its_lookahead():
    """A fast drafter never drafts more than 2 * gamma past what the target has committed."""
    window = 2
    proposer, judge = ToyProposer(error_every=0), ToyJudge(sleep_s=0.05)
    with PearlEngine(proposer, PearlConfig(window_size=window, schedule="eager", backend="thread")) as engine:
        tokens, rounds = toy_run(engine, judge, 20)
    assert tokens == toy_reference(TOY_PROMPT, 20, 50)
    first_commit = judge.log[0][0]
    early = [position for t, position in proposer.log if t < first_commit]
    assert max(early) < TOY_PROMPT.shape[1] + 2 * window
    assert any(r.mode == "post" and r.num_judged == window for r in rounds)  # it did run ahead


def test_first_draft_always_wrong_means_one_token_per_round():
    with PearlEngine(ToyProposer(error_every=1), PearlConfig(4, backend="thread")) as engine:
        judge = ToyJudge()
        tokens, rounds = toy_run(engine, judge, 20)
    assert tokens == toy_reference(TOY_PROMPT, 20, 50)
    assert all(r.mode == "pre" and len(r.tokens) == 1 for r in rounds)
    assert set(judge.blocks) == {0}  # the target never judged a doomed block
    assert sum(r.num_drafted for r in rounds) == 20 and sum(r.num_accepted for r in rounds) == 0


def test_right_drafts_chain_windows_in_post_verify():
    window = 4
    with PearlEngine(ToyProposer(error_every=0), PearlConfig(window, backend="thread")) as engine:
        judge = ToyJudge()
        tokens, rounds = toy_run(engine, judge, 41)
    assert tokens == toy_reference(TOY_PROMPT, 41, 50)
    assert rounds[0].mode == "pre" and len(rounds[0].tokens) == 1
    # every later round judges gamma - 1 waiting drafts and matches the bonus with the next draft
    assert all(r.mode == "post" and len(r.tokens) == window for r in rounds[1:])
    assert sum(r.num_accepted for r in rounds) == sum(r.num_drafted for r in rounds)


def test_a_rejected_first_draft_cancels_the_rest_of_the_window():
    """Drafting stops at once when pre-verify rejects: no waiting for gamma slow drafts."""
    sleep, window, n = 0.1, 10, 8
    with PearlEngine(ToyProposer(error_every=1, sleep_s=sleep), PearlConfig(window, backend="thread")) as engine:
        toy_run(engine, ToyJudge(), 1)  # start the worker outside the timing
        begin = time.perf_counter()
        tokens, _ = toy_run(engine, ToyJudge(), n)
        elapsed = time.perf_counter() - begin
    assert tokens == toy_reference(TOY_PROMPT, n, 50)
    assert elapsed < 0.5 * n * window * sleep  # a barrier would take n * window * sleep = 8 s


def test_budget_limits_the_judged_block():
    with PearlEngine(ToyProposer(error_every=0), PearlConfig(5, backend="thread")) as engine:
        judge = ToyJudge()
        with engine.session(TOY_PROMPT, judge) as session:
            first = session.step(10)
            second = session.step(2)  # 4 drafts wait, but only 2 tokens may be committed
    assert len(first.tokens) == 1 and first.num_waiting == 4
    assert len(second.tokens) == 2 and judge.blocks == [0, 1]


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="window_size"):
        PearlConfig(window_size=0)
    with pytest.raises(ValueError, match="backend"):
        PearlConfig(backend="gpu")
    with pytest.raises(ValueError, match="schedule"):
        PearlConfig(schedule="async")
    with pytest.raises(ValueError, match="draft_threads"):
        PearlConfig(draft_threads=0)


# ---------------------------------------------------------------- shutdown


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_drafter_exception_surfaces_in_the_caller_and_the_worker_exits(backend):
    engine = PearlEngine(ToyProposer(fail_after=5), PearlConfig(3, backend=backend))
    with pytest.raises(DraftWorkerError, match="ValueError.*toy drafter failure") as info:
        toy_run(engine, ToyJudge(), 30)
    assert engine.worker is None
    if backend == "process":  # the toy's message names the worker's pid
        pid = int(str(info.value).rsplit("process ", 1)[1].split()[0])
        assert pid != os.getpid() and gone(pid)
    engine.close()  # idempotent


def test_interrupt_in_the_target_stops_the_worker_and_the_engine_recovers():
    engine = PearlEngine(ToyProposer(), PearlConfig(3, backend="process"))
    with pytest.raises(KeyboardInterrupt):
        toy_run(engine, ToyJudge(interrupt_on_call=3), 30)
    assert engine.worker is None
    pids = {p.pid for p in psutil.Process().children(recursive=True)}
    tokens, _ = toy_run(engine, ToyJudge(), 30)  # a new worker
    assert tokens == toy_reference(TOY_PROMPT, 30, 50)
    pid = engine.worker.pid
    assert pid not in pids
    engine.close()
    assert gone(pid)


def test_a_killed_worker_is_reported_not_waited_for():
    engine = PearlEngine(ToyProposer(sleep_s=0.02), PearlConfig(3, backend="process"))
    begin = None
    with pytest.raises(DraftWorkerError, match="died"):
        with engine.session(TOY_PROMPT, ToyJudge()) as session:
            session.step(100)
            os.kill(engine.worker.pid, signal.SIGKILL)
            begin = time.monotonic()
            for _ in range(100):
                session.step(100)
    assert time.monotonic() - begin < 10
    assert engine.worker is None


def test_a_hung_worker_times_out():
    engine = PearlEngine(ToyProposer(hang_after=4), PearlConfig(3, backend="process", timeout_s=2))
    with pytest.raises(DraftWorkerError, match="sent nothing for 2 s"):
        with engine.session(TOY_PROMPT, ToyJudge()) as session:
            pid = engine.worker.pid
            for _ in range(100):
                session.step(100)
    assert gone(pid)


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time, torch
    from viasd_adapters.third_party.pearl import PearlConfig, PearlEngine
    from viasd_adapters.third_party.pearl.testing import ToyJudge, ToyProposer

    if __name__ == "__main__":
        # As in a terminal: a job started in the background of a non-interactive shell (CI
        # runners) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        engine = PearlEngine(ToyProposer(sleep_s=0.01), PearlConfig(3, backend="process"))
        with engine.session(torch.tensor([[1, 2]]), ToyJudge(sleep_s=0.01)) as session:
            session.step(5)
            print(engine.worker.pid, flush=True)
            while True:
                session.step(5)
    """
)


@pytest.mark.parametrize("how", ["sigkill", pytest.param("sigint", marks=pytest.mark.slow)])
def test_no_orphan_when_the_parent_dies_or_is_interrupted(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        line = parent.stdout.readline()
        if not line:
            parent.wait(30)
            pytest.fail(f"the parent script failed: {parent.stderr.read().decode()[-2000:]}")
        pid = int(line)
        if how == "sigkill":
            parent.kill()
        else:  # Ctrl-C: SIGINT to the whole process group
            os.killpg(parent.pid, signal.SIGINT)
        parent.wait(60)  # shutdown takes at most 3 x 5 s
        assert gone(pid), f"draft worker {pid} outlived its parent ({how})"
    finally:
        if parent.poll() is None:
            parent.kill()


_SLOW_START_SCRIPT = textwrap.dedent(
    """
    import torch
    from viasd_adapters.third_party.pearl import PearlConfig, PearlEngine
    from viasd_adapters.third_party.pearl.testing import ToyJudge, ToyProposer

    if __name__ == "__main__":
        # The drafter takes a minute to load in the worker, as a large draft model would.
        engine = PearlEngine(ToyProposer(load_s=60), PearlConfig(3, backend="process", start_timeout_s=120))
        with engine.session(torch.tensor([[1, 2]]), ToyJudge()) as session:
            session.step(5)
    """
)


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_no_orphan_when_the_parent_dies_while_the_worker_loads(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(_SLOW_START_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        deadline, worker = time.monotonic() + 60, None
        while worker is None and time.monotonic() < deadline and parent.poll() is None:
            workers = [
                c for c in psutil.Process(parent.pid).children() if "resource_tracker" not in " ".join(c.cmdline())
            ]
            worker = workers[0] if workers else None
            time.sleep(0.2)
        if worker is None:
            pytest.fail(
                f"no draft worker started: {parent.stderr.read().decode()[-2000:] if parent.poll() is not None else ''}"
            )
        time.sleep(3)  # well inside its minute of loading
        parent.kill()
        parent.wait(30)
        assert gone(worker.pid, within_s=15), "the draft worker kept loading after its parent died"
    finally:
        if parent.poll() is None:
            parent.kill()


# ---------------------------------------------------------------- the adapter (tiny models)


@pytest.fixture(scope="module")
def process_pearl(tiny_target, tiny_draft):
    """One process-backend decoder for the module (a draft process takes seconds to start)."""
    decoder = PearlDecoder(ModelDrafter(tiny_draft), LosslessVerifier(tiny_target.model), window_size=3)
    yield decoder
    decoder.close()


def pearl(draft, verifier, window=3, backend="thread", schedule="window"):
    return PearlDecoder(ModelDrafter(draft), verifier, window_size=window, schedule=schedule, backend=backend)


class SlowVerifier(Verifier):
    """A real verifier that takes `sleep_s` longer per block, as a target much larger than its
    draft does: the eager drafter then runs ahead and its waiting drafts get judged."""

    def __init__(self, inner: Verifier, sleep_s: float):
        self.inner, self.sleep_s = inner, sleep_s

    vocab_size = property(lambda self: self.inner.vocab_size)
    context_length = property(lambda self: self.inner.context_length)
    stats = property(lambda self: self.inner.stats)

    def reset(self):
        self.inner.reset()

    def verify(self, input_ids, draft, sampler):
        time.sleep(self.sleep_s)
        return self.inner.verify(input_ids, draft, sampler)


@pytest.mark.parametrize("schedule, window", [("window", 2), ("window", 3), ("window", 5), ("eager", 3)])
def test_greedy_pearl_equals_greedy_ar_fp32(tiny_target, tiny_draft, schedule, window):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 80)
    verifier = LosslessVerifier(tiny_target.model)
    if schedule == "eager":  # a tiny target is as fast as its drafter: make it slower, or eager is AR
        verifier = SlowVerifier(verifier, 0.02)
    decoder = pearl(tiny_draft, verifier, window, schedule=schedule)
    out = decoder.generate(PROMPT, 80)
    again = decoder.generate(PROMPT, 80)  # the worker is reused
    decoder.close()
    assert out.tokens == ar.tokens == again.tokens
    assert 0 < out.stats.accepted < out.stats.drafted  # drafts were judged, kept and rejected
    assert out.stats.model_calls["target"].calls < len(ar.tokens)
    assert {"draft", "target"} == set(out.stats.model_calls)
    assert out.stats.new_tokens == 80 and out.stats.steps == out.stats.model_calls["target"].calls
    assert out.stats.accepted <= sum(out.stats.tier_counts.values()) <= out.stats.drafted


def test_process_backend_equals_ar_and_thread_backend(tiny_target, tiny_draft, process_pearl):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 60)
    assert process_pearl.generate(PROMPT, 60).tokens == ar.tokens
    # sampled: draws are seeded by position, so the schedule of the two workers does not matter
    threaded = pearl(tiny_draft, LosslessVerifier(tiny_target.model)).generate(PROMPT, 60, SAMPLED)
    assert process_pearl.generate(PROMPT, 60, SAMPLED).tokens == threaded.tokens


def test_seeded_sampling_is_reproducible(tiny_target, tiny_draft):
    decoder = pearl(tiny_draft, LosslessVerifier(tiny_target.model))
    run = lambda seed: decoder.generate(PROMPT, 40, SamplingConfig(temperature=1.0, seed=seed)).tokens
    assert run(7) == run(7)
    assert run(7) != run(8)
    decoder.close()


def test_stop_token_and_budget_end_the_generation(tiny_target, tiny_draft, process_pearl):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 30)
    stop = ar.tokens[7]
    first = ar.tokens.index(stop)
    out = process_pearl.generate(PROMPT, 30, stop_token_ids=(stop,))
    assert out.tokens == ar.tokens[: first + 1]
    for n in (1, 2, 9):
        assert process_pearl.generate(PROMPT, n).tokens == ar.tokens[:n]


@pytest.mark.parametrize(
    "schedule, tiers_off",
    [
        pytest.param("window", False, marks=pytest.mark.slow),  # tiered PEARL sampling stays in the default run
        pytest.param("window", True, marks=pytest.mark.slow),
        pytest.param("eager", False, marks=pytest.mark.slow),
    ],
    ids=["window", "window-tiered-verifier-off", "eager"],
)
def test_pearl_sampling_reproduces_the_target_distribution(schedule, tiers_off):
    """Statistical: the first three sampled tokens under PEARL follow the target's exact marginals
    (with plain SD's verifier, and with VIA-SD's verifier with its tiers off)."""
    target, draft = sampling_pair()
    q, p = exact_marginals(target, PROMPT, 3), exact_marginals(draft, PROMPT, 3)  # [3, V] each
    verifier = TieredVerifier(target) if tiers_off else LosslessVerifier(target)
    decoder = pearl(draft, verifier, window=2, schedule=schedule)
    counts, results = sample_counts(decoder, PROMPT, q.shape[1], 3, N_SAMPLED)
    decoder.close()
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert N_SAMPLED // 4 < accepted < drafted - N_SAMPLED // 4  # drafts were kept and rejected
    for i in range(3):
        assert chi_square_power(q[i], p[i], N_SAMPLED) > POWER  # it tells the target from the draft
        assert chi_square_p(counts[i], q[i]) > P_MIN, (i, total_variation(counts[i], q[i]))


# ---------------------------------------------------------------- VIA-SD inside PEARL


def test_slim_tier_off_equals_greedy_ar(tiny_target, tiny_draft):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 60)
    off = pearl(tiny_draft, TieredVerifier(tiny_target.model)).generate(PROMPT, 60)
    assert off.tokens == ar.tokens
    assert 0 < off.stats.accepted < off.stats.drafted
    assert set(off.stats.model_calls) == {"draft", "target"}


def test_tiered_pearl_sampling_reproduces_the_target_distribution():
    """Statistical: slim = target (u = q) with active tiers and a draft unlike both, so drafts are
    rejected and recovered from the residual too; the first three sampled tokens follow q."""
    target, draft = sampling_pair()
    N = 800
    q = exact_marginals(target, PROMPT, 3)  # [3, V]
    decoder = pearl(draft, TieredVerifier(target, target, ConfidencePolicy(0.3, 0.0, 0.3)), window=2)
    counts, results = sample_counts(decoder, PROMPT, q.shape[1], 3, N)
    decoder.close()
    tiers = sum((Counter(r.stats.tier_counts) for r in results), Counter())
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert tiers[Tier.ACCEPT] > N // 4 and tiers[Tier.ESCALATE] > N // 20  # u settled drafts, q others
    assert accepted < drafted - N // 4  # rejected drafts: the residual path ran
    assert float(q[1].max()) < 0.6
    for i in range(3):
        assert chi_square_p(counts[i], q[i]) > P_MIN, (i, total_variation(counts[i], q[i]))


def test_tiered_pearl_uses_the_slim_tier(tiny_target, tiny_draft):
    slim = perturbed(tiny_target.model, scale=0.01, seed=9)
    policy = ConfidencePolicy(tau_accept=0.1, tau_slim=0.25)  # all tiers occur on the tiny pair
    tiered = pearl(tiny_draft, TieredVerifier(tiny_target.model, slim, policy, rejudge=False)).generate(PROMPT, 60)
    plain = pearl(tiny_draft, LosslessVerifier(tiny_target.model)).generate(PROMPT, 60)
    assert len(tiered.tokens) == 60
    assert {"accept", "full"} <= set(tiered.stats.tier_counts)
    assert {"draft", "target", "slim"} == set(tiered.stats.model_calls)
    assert tiered.stats.model_calls["target"].calls < plain.stats.model_calls["target"].calls


# ---------------------------------------------------------------- Hydra


def test_framework_pearl_composes_with_a_pair_and_equals_ar():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name="generate",
            overrides=[
                "model_pair=tiny-random",
                "framework=pearl",
                "verifier=full",
                "framework.decoder.backend=thread",
            ],
        )
        ar_cfg = compose(config_name="generate", overrides=["model_pair=tiny-random", "framework=ar"])
    pair = load_pair(cfg.model_pair)
    decoder = build_decoder(cfg.framework, cfg.verifier, pair)
    assert isinstance(decoder, PearlDecoder) and decoder.config.window_size == cfg.framework.decoder.window_size
    ar = build_decoder(ar_cfg.framework, ar_cfg.verifier, pair)
    ids = torch.tensor([[10, 20, 30, 40]])
    assert decoder.generate(ids, 40).tokens == ar.generate(ids, 40).tokens
    decoder.close()
