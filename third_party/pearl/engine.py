"""PEARL: parallel speculative decoding with adaptive draft length (Liu et al., ICLR 2025).

Every round runs the drafter and the target at the same time, in one of two modes:

* pre-verify (no drafts are waiting): the drafter drafts gamma tokens after the committed
  sequence while the target computes its own next token (a judgement of zero drafts). The first
  draft is kept only if it equals that token; otherwise the target's token is committed and the
  drafter is cancelled at once: a bad draft costs no target forward of its own.
* post-verify (drafts are waiting): the target judges them while the drafter keeps drafting
  gamma tokens past them. If the judgement keeps every waiting draft, the new drafts stay and
  the next round is post-verify again; otherwise they are dropped and the next round is
  pre-verify.

The draft length therefore adapts: one token when the first draft is wrong, and chains of
gamma-token windows, as long as the drafts keep being accepted, when they are right.

One rule decides what survives a round: the committed sequence grows by the judgement's tokens,
and a draft survives if the tokens before it equal what was committed. It covers pre-verify
(the first draft against the target's token), the bonus token of a fully accepted block (the
first new draft against it), and rewritten tokens (a tiered judge may rewrite a draft into the
same token).

That is exact for greedy judges. A sampling judge instead judges every draft itself (see
`Session`): pre-verify then waits for the first draft, and a bonus token is dropped when
drafts follow it.

Two schedules (`PearlConfig.schedule`):

* "window" (the paper): every round asks for gamma drafts and, when they survive, waits for all
  gamma before the next round (the paper's per-step synchronisation). Blocks never depend on
  timing, so sampled outputs are reproducible.
* "eager" (an extension): the drafter drafts ahead without stopping, up to `2 * gamma` tokens
  past the committed sequence, and each round judges the drafts that exist when it starts (at
  most gamma). Neither side waits for the other, and the draft length follows the speed ratio
  of the moment. Greedy output is the same; sampled output stays lossless, but which blocks are
  judged (and so which random draws are made) depends on timing.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from typing import Any

import torch

from .protocol import (
    DraftEnd,
    DraftRequest,
    DraftToken,
    Judge,
    Judgement,
    Proposer,
    ResetRequest,
    StatsReply,
    StatsRequest,
)
from .workers import DraftWorker, ProcessDraftWorker, ThreadDraftWorker

BACKENDS = ("process", "thread")
SCHEDULES = ("window", "eager")


@dataclass
class PearlConfig:
    """How the engine runs; none of it changes which tokens greedy decoding produces."""

    window_size: int = 3  # gamma: tokens drafted per round; the paper sets it to the target/draft forward-time ratio
    schedule: str = "window"  # "window": the paper's synchronised rounds; "eager": the drafter never waits
    backend: str = "process"  # "process": the drafter in its own process; "thread": in a thread of this one
    draft_threads: int | None = 1  # torch threads of the drafter; None leaves torch's default
    target_threads: int | None = 1  # torch threads of the caller while a generation runs; None leaves them
    start_method: str = "spawn"  # multiprocessing start method of the process backend
    timeout_s: float = 600.0  # longest wait for one message from the drafter before it counts as hung
    start_timeout_s: float = 900.0  # longest wait for a new draft worker to be ready

    @property
    def lookahead(self) -> int | None:
        """Most drafts past the committed sequence the drafter may make (None: no limit)."""
        return 2 * self.window_size if self.schedule == "eager" else None

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("draft_threads", "target_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be > 0")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method not in methods:
            raise ValueError(f"start_method must be one of {methods} on this system, got {self.start_method!r}")


@dataclass
class Round:
    """What one PEARL round did."""

    mode: str  # "pre" (pre-verify) or "post" (post-verify)
    tokens: torch.Tensor  # [m] long, committed this round
    num_judged: int  # K: drafts the judge saw (0 in pre-verify)
    num_drafted: int  # drafts decided this round: K, plus one checked against the judge's own token
    num_accepted: int  # drafts committed unchanged
    counts: dict[str, int] = field(default_factory=dict)  # drafts decided per tier
    num_waiting: int = 0  # drafts carried into the next round


@dataclass
class _Draft:
    token: int
    probs: torch.Tensor | None  # [V]


class _RoundStream:
    """The drafts of one draft round, read from the worker as they arrive."""

    def __init__(self, worker: DraftWorker, round_id: int):
        self.worker = worker
        self.round_id = round_id
        self.drafts: list[_Draft] = []
        self.ended = False

    def fill(self, count: int | None = None) -> list[_Draft]:
        """Wait until `count` drafts arrived (None: until the round ends) or the round ended."""
        while not self.ended and (count is None or len(self.drafts) < count):
            self._take(self.worker.receive())
        return self.drafts

    def drain(self) -> list[_Draft]:
        """Take the drafts that arrived, without waiting."""
        while not self.ended and (message := self.worker.try_receive()) is not None:
            self._take(message)
        return self.drafts

    def _take(self, message) -> None:
        if isinstance(message, DraftEnd):
            self.ended = self.ended or message.round_id == self.round_id
        elif isinstance(message, DraftToken):
            if message.round_id != self.round_id:
                return  # a cancelled round's leftovers
            assert message.index == len(self.drafts), (message.index, len(self.drafts))
            self.drafts.append(_Draft(message.token, self.worker.probs_of(message)))
        else:
            raise AssertionError(f"unexpected message from the draft worker: {message!r}")

    def cancel(self) -> None:
        self.worker.cancel_below(self.round_id + 1)


class PearlEngine:
    """Owns the draft worker (started on first use, reused across generations) and runs sessions."""

    def __init__(self, proposer: Proposer, config: PearlConfig | None = None):
        self.proposer = proposer
        self.config = config or PearlConfig()
        self.worker: DraftWorker | None = None
        self._in_session = False
        self._last_round_id = 0  # round ids grow across sessions: cancelling is "every id below"

    def start(self) -> None:
        """Start the draft worker now (else the first session does; a process takes seconds)."""
        self._ensure_worker()

    def _ensure_worker(self) -> DraftWorker:
        if self.worker is not None and self.worker.alive:
            return self.worker
        cfg = self.config
        if cfg.backend == "thread":
            self.worker = ThreadDraftWorker(self.proposer, cfg.draft_threads, cfg.timeout_s, cfg.start_timeout_s)
        else:
            # Unread rows at once: a window (or the lookahead) and a round's commit; the worker
            # also waits for free rows, so this only sets how often it might have to.
            self.worker = ProcessDraftWorker(
                self.proposer,
                cfg.draft_threads,
                cfg.timeout_s,
                cfg.start_timeout_s,
                ring_slots=4 * cfg.window_size + 8,
                start_method=cfg.start_method,
            )
        return self.worker

    def session(
        self,
        prompt_ids: torch.Tensor,
        judge: Judge,
        settings: Any = None,
        seed: int = 0,
        match_own_token: bool = True,
    ) -> Session:
        """A generation after `prompt_ids` ([1, T]); use it as a context manager.

        `match_own_token` picks how a draft that follows a fully judged block is decided (see
        `Session`): True for greedy judges, False when the judge samples.
        """
        if self._in_session:
            raise RuntimeError("a PEARL engine runs one generation at a time")
        return Session(self, prompt_ids, judge, settings, seed, match_own_token)

    def close(self) -> None:
        """Stop the draft worker (a later session starts a new one)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def __enter__(self) -> PearlEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session:
    """One generation: call `step` until done; the drafter's statistics are in `draft_stats` after.

    Two rules decide a draft that follows a fully judged block, i.e. the first new draft of a
    pre-verify round or of a post-verify round whose block was kept whole:

    * `match_own_token=True`: the judge gives its own token for that position (pre-verify
      judges zero drafts, so the target starts at once; post-verify's bonus token) and the
      draft survives if it equals it. With a greedy judge that is exactly greedy matching.
    * `match_own_token=False`: the draft goes through the judge like every other draft
      (rejection sampling keeps it with probability min(1, q/p)); matching two samples would
      be lossless too, but rarely succeeds. Pre-verify then waits for the first draft and
      judges it, and a round that keeps its whole block drops the judge's own token in favour
      of judging the next draft in the next round (one more token in that target forward).
      Dropping it is lossless: whether it is dropped never depends on its value.
    """

    def __init__(
        self,
        engine: PearlEngine,
        prompt_ids: torch.Tensor,
        judge: Judge,
        settings: Any,
        seed: int,
        match_own_token: bool = True,
    ):
        B, T = prompt_ids.shape
        assert B == 1 and T >= 1
        self.engine = engine
        self.config = engine.config
        self.judge = judge
        self.settings = settings
        self.seed = seed
        self.match_own_token = match_own_token
        self.ids = prompt_ids  # [1, T] committed
        self.draft_stats: dict[str, Any] = {}
        self.worker: DraftWorker | None = None
        self._saved_threads: int | None = None
        # window schedule: drafts after `ids`, not judged yet, consistent with `ids`
        self.waiting: list[_Draft] = []
        # eager schedule: one draft stream from absolute position `_base` while it agrees with `ids`
        self._stream: _RoundStream | None = None
        self._base = 0  # absolute position of the stream's first draft
        self._checked = 0  # positions below this are committed and agree with the stream
        self._own: dict[int, str] = {}  # position -> tier of a judge's own token no draft was compared with yet

    def __enter__(self) -> Session:
        self.engine._in_session = True
        try:
            self.worker = self.engine._ensure_worker()
            self.worker.send(ResetRequest(self.settings))
            self._allow()
            threads = self.config.target_threads
            if threads:
                self._saved_threads = torch.get_num_threads()
                torch.set_num_threads(threads)
        except BaseException:
            self.engine._in_session = False
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None:
                # Interrupted or failed mid-round: the worker's state is unknown, stop it.
                self.engine.close()
            else:
                self.worker.cancel_below(self.engine._last_round_id + 1)
                self.worker.send(StatsRequest())
                while not isinstance(reply := self.worker.receive(), StatsReply):
                    pass  # drafts of cancelled rounds
                self.draft_stats = reply.stats
        except BaseException:
            self.engine.close()
            raise
        finally:
            if self._saved_threads is not None:
                torch.set_num_threads(self._saved_threads)
            self.engine._in_session = False

    def _allow(self) -> None:
        lookahead = self.config.lookahead
        self.worker.allow_until(None if lookahead is None else self.ids.shape[1] + lookahead)

    def _submit(self, prefix: torch.Tensor, num_tokens: int) -> _RoundStream | None:
        """Ask the drafter for `num_tokens` drafts after `prefix` ([T] long)."""
        if num_tokens < 1:
            return None
        self.engine._last_round_id += 1
        round_id = self.engine._last_round_id
        self.worker.send(DraftRequest(round_id, prefix.cpu(), num_tokens, self.seed))
        return _RoundStream(self.worker, round_id)

    def _judge(self, block: list[_Draft]) -> tuple[Judgement, torch.Tensor]:
        """The judge's verdict on `block`, and the block's tokens ([K] long)."""
        tokens = self.ids.new_tensor([d.token for d in block])  # [K]
        probs = None
        if block and all(d.probs is not None for d in block):
            probs = torch.stack([d.probs for d in block]).to(self.ids.device)  # [K, V]
        judgement = self.judge.judge(self.ids, tokens, probs)
        m = judgement.tokens.numel()
        assert 1 <= m <= len(block) + 1, f"a judgement must commit 1..K+1 tokens, got {m} for K={len(block)}"
        return judgement, tokens

    def step(self, limit: int) -> Round:
        """One round; commits between 1 and `limit` tokens (the caller's remaining budget)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if self.config.schedule == "eager":
            return self._step_eager(limit)
        return self._step_window(limit)

    # ------------------------------------------------------------------ the paper's schedule
    def _step_window(self, limit: int) -> Round:
        gamma = self.config.window_size
        waiting = self.waiting
        mode = "post" if waiting else "pre"

        # 1. draft: gamma tokens past the waiting drafts, while the target judges
        prefix = torch.cat([self.ids[0], self.ids.new_tensor([d.token for d in waiting])])
        stream = self._submit(prefix, min(gamma, max(0, limit - len(waiting))))
        new: list[_Draft] = []
        if mode == "pre" and not self.match_own_token and limit >= 2 and stream is not None:
            new = list(stream.fill(1))  # pre-verify judges the first draft itself
        block = (waiting + new)[: limit - 1]  # never judge more than the budget can commit
        K = len(block)

        # 2. judge (K == 0: the target's own next token)
        judgement, tokens = self._judge(block)
        committed = judgement.tokens.to(self.ids.device)  # [m]
        m = committed.numel()

        # 3. keep the drafts that agree with the committed tokens
        def chain() -> list[_Draft]:
            return waiting + (stream.drafts if stream is not None else [])

        kept_whole = m == K + 1 and committed[:K].tolist() == tokens.tolist()
        if not self.match_own_token and K and kept_whole and K + 1 < limit:
            if stream is not None:
                stream.fill()
            if len(chain()) > K:  # a draft follows: judge it next round instead of the own token
                committed, m = committed[:K], K
        if stream is not None and len(chain()) < m:
            stream.fill(m - len(waiting))
        survive = len(chain()) >= m and committed.tolist() == [d.token for d in chain()[:m]]
        if stream is not None:
            if survive:
                stream.fill()  # the paper's barrier: the whole window before the next round
            else:
                stream.cancel()
        self.waiting = chain()[m:] if survive else []
        self.ids = torch.cat([self.ids, committed[None]], dim=1)

        # 4. count decisions: the K judged drafts, plus one matched against the judge's own token
        counts = dict(judgement.counts)
        drafted, accepted = judgement.num_drafted, judgement.num_accepted
        if m == K + 1 and len(chain()) > K:
            drafted += 1
            accepted += int(chain()[K].token == int(committed[K]))
            counts[judgement.next_token_tier] = counts.get(judgement.next_token_tier, 0) + 1
        return Round(mode, committed, K, drafted, accepted, counts, len(self.waiting))

    # ------------------------------------------------------------------ the eager schedule
    def _step_eager(self, limit: int) -> Round:
        tally = _Tally()
        # 1. the drafts that arrived; restart the drafter if they contradict the commit or ran out
        self._sync(tally, limit)
        if self._stream is None or (self._stream.ended and not self._ahead()):
            self._restart(limit)
        waiting = self._ahead()
        mode = "post" if waiting else "pre"
        if not waiting and not self.match_own_token and limit >= 2 and self._stream is not None:
            self._stream.fill(self.ids.shape[1] - self._base + 1)  # pre-verify judges the first draft
            waiting = self._ahead()
        block = waiting[: min(limit - 1, self.config.window_size)]
        K = len(block)

        # 2. judge what is there (K == 0: the target's own next token)
        judgement, tokens = self._judge(block)
        committed = judgement.tokens.to(self.ids.device)  # [m]
        m = committed.numel()
        tally.add(judgement.num_drafted, judgement.num_accepted, judgement.counts)
        kept_whole = m == K + 1 and committed[:K].tolist() == tokens.tolist()
        if not self.match_own_token and K and kept_whole and K + 1 < limit:
            if len(waiting) > K or not self._stream.ended:  # a draft follows: judge it next round
                committed, m = committed[:K], K
        if m == K + 1:
            self._own[self.ids.shape[1] + K] = judgement.next_token_tier

        # 3. commit, let the drafter run further ahead, and check the drafts already here
        self.ids = torch.cat([self.ids, committed[None]], dim=1)
        self._allow()
        self._sync(tally, limit - m)
        waiting_after = len(self._ahead()) if self._stream is not None else 0
        return Round(mode, committed, K, tally.drafted, tally.accepted, tally.counts, waiting_after)

    def _ahead(self) -> list[_Draft]:
        """Stream drafts past the committed sequence."""
        if self._stream is None:
            return []
        return self._stream.drafts[self.ids.shape[1] - self._base :]

    def _restart(self, limit: int) -> None:
        """Cancel the stream and start drafting after the committed sequence."""
        if self._stream is not None:
            self._stream.cancel()
        self._own.clear()
        self._base = self._checked = self.ids.shape[1]
        self._stream = self._submit(self.ids[0], limit)

    def _sync(self, tally: _Tally, limit: int) -> None:
        """Take arrived drafts and compare those at committed positions with the commit."""
        if self._stream is None:
            return
        drafts = self._stream.drain()
        T = self.ids.shape[1]
        while self._checked < T and self._checked - self._base < len(drafts):
            position = self._checked
            draft = drafts[position - self._base]
            equal = draft.token == int(self.ids[0, position])
            tier = self._own.pop(position, None)
            if tier is not None:  # a draft decided by the judge's own token
                tally.add(1, int(equal), {tier: 1})
            if not equal:
                if limit > 0:
                    self._restart(limit)
                else:  # the budget is spent: nothing more to draft
                    self._stream.cancel()
                    self._stream = None
                return
            self._checked += 1


@dataclass
class _Tally:
    """Decisions counted during one eager round."""

    drafted: int = 0
    accepted: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, drafted: int, accepted: int, counts: dict[str, int]) -> None:
        self.drafted += drafted
        self.accepted += accepted
        for tier, n in counts.items():
            self.counts[tier] = self.counts.get(tier, 0) + n
