"""PEARL as a `Decoder`: the engine of this package with the project's drafter and verifier.

The engine runs the drafter in a draft worker (a process or a thread) and calls the target side
in this process. The target side is any `Verifier`: `LosslessVerifier` gives plain PEARL, and
`TieredVerifier` puts VIA-SD's slim verifier inside PEARL's verify step with no change to the
drafter. Pre-verify asks the verifier for its own next token (a block of zero drafts).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter

import torch

from ..decode.loops import CommittedSequence, Decoder, GenerationResult, check_same_vocabulary
from ..decode.stats import DecodeStats
from ..draft.base import DraftBlock, Drafter
from ..runner import CallStats
from ..sampling import Sampler, SamplingConfig
from ..third_party.pearl.engine import PearlConfig, PearlEngine
from ..third_party.pearl.protocol import Judgement
from ..verify.base import Verdict, Verifier

logger = logging.getLogger(__name__)


class DrafterProposer:
    """A project `Drafter` seen by the engine: one token per call, seeded by position.

    It travels to the draft worker (pickled, for the process backend) and builds its sampler
    there, on the device of the ids it is given.
    """

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.settings: SamplingConfig | None = None
        self.sampler: Sampler | None = None

    @property
    def vocab_size(self) -> int | None:
        return self.drafter.vocab_size

    def reset(self, settings: SamplingConfig) -> None:
        self.drafter.reset()
        self.settings = settings
        self.sampler = None

    def propose(self, ids: torch.Tensor, seed: int):
        if self.sampler is None:
            self.sampler = Sampler(self.settings or SamplingConfig(), ids.device)
        self.sampler.generator.manual_seed(seed)  # the draft at this position never depends on timing
        block = self.drafter.propose(ids, 1, self.sampler)
        if len(block) == 0:
            return None
        return int(block.tokens[0]), None if block.probs is None else block.probs[0]

    def stats(self) -> dict[str, CallStats]:
        return self.drafter.stats


class VerifierJudge:
    """A project `Verifier` seen by the engine, with the target-side sampler of one generation."""

    def __init__(self, verifier: Verifier, sampler: Sampler):
        self.verifier = verifier
        self.sampler = sampler

    def judge(self, ids: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None) -> Judgement:
        verdict = self.verifier.verify(ids, DraftBlock(tokens, probs), self.sampler)
        return Judgement(
            tokens=verdict.tokens,
            num_accepted=verdict.num_accepted,
            num_drafted=verdict.num_drafted,
            counts=draft_counts(verdict),
            next_token_tier=verdict.last_tier,
        )


def draft_counts(verdict: Verdict) -> dict[str, int]:
    """The verdict's tier counts less the token after a block kept whole (the bonus token).

    A `Verdict` counts every committed token; the engine counts judged drafts and adds the
    verifier's own token itself, under `next_token_tier`, when it judges a draft with it.
    """
    counts = dict(verdict.tier_counts)
    if verdict.num_accepted == verdict.num_drafted and verdict.tokens.numel() > verdict.num_drafted:
        counts[verdict.last_tier] -= 1
        if not counts[verdict.last_tier]:
            del counts[verdict.last_tier]
    return counts


class PearlDecoder(Decoder):
    """PEARL (Liu et al., ICLR 2025): drafting and verification at the same time, with pre-verify,
    post-verify and adaptive draft length. Lossless when the verifier is.

    The draft worker starts on the first `generate` and is reused; `close()` stops it (it also
    stops when this object is collected or the interpreter exits).
    """

    @staticmethod
    def check_settings(drafter=None, verifier=None, **settings) -> None:
        """The plain settings' rules (also checked before any model loads: `viasd_adapters.checks`)."""
        PearlConfig(**settings)

    def __init__(
        self,
        drafter: Drafter,
        verifier: Verifier,
        window_size: int = 3,
        schedule: str = "window",
        backend: str = "process",
        draft_threads: int | None = 1,
        target_threads: int | None = 1,
        start_method: str = "spawn",
        timeout_s: float = 600.0,
        start_timeout_s: float = 900.0,
    ):
        """
        Args:
            drafter: proposes tokens, one per call, inside the draft worker.
            verifier: judges blocks in this process (LosslessVerifier: plain PEARL).
            window_size: gamma, tokens drafted per round; the paper picks the target/draft
                forward-time ratio (measured with both running at once).
            schedule: "window" (the paper: rounds wait for the whole window) or "eager" (the
                drafter drafts ahead without waiting; each round judges what exists, <= gamma).
            backend: "process" (own process, own torch threads) or "thread".
            draft_threads / target_threads: torch threads of each side; None keeps torch's.
            start_method: multiprocessing start method of the process backend.
            timeout_s: longest wait for one message from the draft worker.
            start_timeout_s: longest wait for a new draft worker to be ready.
        """
        check_same_vocabulary(drafter, verifier)
        self.drafter = drafter
        self.verifier = verifier
        self.config = PearlConfig(
            window_size=window_size,
            schedule=schedule,
            backend=backend,
            draft_threads=draft_threads,
            target_threads=target_threads,
            start_method=start_method,
            timeout_s=timeout_s,
            start_timeout_s=start_timeout_s,
        )
        self.engine = PearlEngine(DrafterProposer(drafter), self.config)

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=(), streamer=None):
        sampling = sampling or SamplingConfig()
        sampler = Sampler(sampling, input_ids.device)
        committed = CommittedSequence(input_ids, max_new_tokens, stop_token_ids, self.verifier.context_length, streamer)
        self.verifier.reset()
        self.engine.start()  # a new draft process loads outside the timed loop
        stats = DecodeStats()
        modes: Counter = Counter()
        begin = time.perf_counter()
        judge = VerifierJudge(self.verifier, sampler)
        # Greedy: a draft after a judged block is kept iff it equals the verifier's own token
        # (exactly greedy matching, and pre-verify need not wait for the first draft). Sampling:
        # every draft goes through the verifier's rejection sampling.
        with self.engine.session(input_ids, judge, sampling, sampling.seed, match_own_token=sampling.greedy) as session:
            while not committed.done:
                # 1-2. draft and verify at once; 3. keep the drafts consistent with the commit
                round_ = session.step(committed.remaining)
                # 4. commit (cut at a stop token or the budget)
                committed.commit(round_.tokens)
                stats.add_round(round_.num_drafted, round_.num_accepted, round_.counts)
                modes[round_.mode] += 1
        stats.seconds = time.perf_counter() - begin
        stats.new_tokens = len(committed.new_tokens)
        stats.model_calls = {**session.draft_stats, **self.verifier.stats}
        logger.debug("PEARL rounds: %d pre-verify, %d post-verify", modes["pre"], modes["post"])
        return GenerationResult(committed.new_tokens, stats)

    def cores(self, threads: int) -> int:
        """The verifier's threads plus the draft worker's: PEARL runs both at once."""
        target = self.config.target_threads or threads
        draft = self.config.draft_threads or (os.cpu_count() or 1 if self.config.backend == "process" else threads)
        return target + draft

    def close(self) -> None:
        """Stop the draft worker (the next `generate` starts a new one)."""
        self.engine.close()
