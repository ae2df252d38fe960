"""Draft workers: the drafter runs beside the target, in a thread or in a process of its own.

Both backends run the same loop (`serve`) and speak the messages of `protocol.py`. Three shared
integers steer a running draft without a message round trip (`_Controls`): rounds below
`cancel_below` are abandoned between two tokens, no draft is made at a position at or past
`allow_until`, and (process backend) no ring row is overwritten before the engine read it.

The engine never blocks without a deadline: every wait polls with a timeout and checks that the
worker is alive, so a crashed, killed or hung worker becomes a `DraftWorkerError` in the caller.
A process worker ignores SIGINT (the caller decides what an interrupt means) and exits by
itself when its parent dies, so it is never orphaned.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import threading
import time
import traceback
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing as mp

from .protocol import (
    DraftEnd,
    DraftRequest,
    DraftToken,
    Failed,
    Proposer,
    Ready,
    ResetRequest,
    StatsReply,
    StatsRequest,
    Stop,
    position_seed,
)

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often a blocked side re-checks that the other side is alive
_GRACE_S = 5.0  # how long shutdown waits at each step (stop request, terminate, kill)
_WAIT_S = 0.001  # how often a throttled drafter re-checks its allowance
_UNLIMITED = 1 << 62


class DraftWorkerError(RuntimeError):
    """The draft worker failed, died or stopped answering; it has been shut down."""


class _Value:
    """An int with a `.value`, like a shared `mp.Value`, for the thread backend."""

    def __init__(self, value: int = 0):
        self.value = value


class _Controls:
    """Integers the engine writes and the worker reads (plain ints for threads, `mp.Value`s for processes)."""

    def __init__(self, make: Callable[[int], Any]):
        self.cancel_below = make(0)  # abandon draft rounds with a smaller id
        self.allow_until = make(_UNLIMITED)  # draft no token at this absolute position or later
        self.read = make(0)  # ring rows the engine has read (flow control of the probs ring)


def serve(
    proposer: Proposer,
    inbox,
    outbox,
    controls: _Controls,
    emit_probs: Callable[[torch.Tensor | None], tuple[torch.Tensor | None, int | None]],
    parent_alive: Callable[[], bool],
) -> None:
    """The worker loop: answer requests until `Stop`, or until the parent is gone."""
    outbox.put(Ready())
    while True:
        try:
            request = inbox.get(timeout=POLL_S)
        except queue.Empty:
            if not parent_alive():
                return
            continue
        try:
            if isinstance(request, Stop):
                return
            if isinstance(request, DraftRequest):
                _draft(proposer, request, outbox, controls, emit_probs, parent_alive)
            elif isinstance(request, ResetRequest):
                proposer.reset(request.settings)
            elif isinstance(request, StatsRequest):
                outbox.put(StatsReply(proposer.stats()))
            else:
                raise TypeError(f"unknown request {request!r}")
        except Exception as err:  # reported to the engine, which raises it in the caller
            outbox.put(Failed(type(err).__name__, traceback.format_exc()))
            return


def _draft(proposer, request: DraftRequest, outbox, controls: _Controls, emit_probs, parent_alive) -> None:
    ids = request.prefix[None]  # [1, T]
    produced = 0

    def cancelled() -> bool:
        return request.round_id < controls.cancel_below.value

    while produced < request.num_tokens and not cancelled():
        position = ids.shape[1]
        if position >= controls.allow_until.value:  # far enough ahead: wait for the target
            if not parent_alive():
                return
            time.sleep(_WAIT_S)
            continue
        proposal = proposer.propose(ids, position_seed(request.seed, position))
        if proposal is None:  # the drafter ran dry
            break
        token, probs = proposal
        probs, slot = emit_probs(probs)
        outbox.put(DraftToken(request.round_id, produced, int(token), probs, slot))
        produced += 1
        ids = torch.cat([ids, ids.new_tensor([[int(token)]])], dim=1)
    outbox.put(DraftEnd(request.round_id, produced))


class DraftWorker(ABC):
    """A running drafter the engine talks to with messages."""

    def __init__(self, timeout_s: float, controls: _Controls):
        self.timeout_s = timeout_s
        self.controls = controls

    @abstractmethod
    def send(self, message: Any) -> None:
        """Queue a request."""

    @property
    @abstractmethod
    def alive(self) -> bool:
        """Whether the worker still runs."""

    @abstractmethod
    def close(self) -> None:
        """Stop the worker and free what it holds; safe to call twice."""

    @abstractmethod
    def _get(self, timeout: float | None) -> Any:
        """The next message (None: without waiting); raises `queue.Empty` when there is none."""

    @abstractmethod
    def probs_of(self, message: DraftToken) -> torch.Tensor | None:
        """The [V] distribution a `DraftToken` carries (copied out of shared buffers)."""

    def cancel_below(self, round_id: int) -> None:
        """Abandon every draft round with an id below `round_id`."""
        self.controls.cancel_below.value = max(self.controls.cancel_below.value, round_id)

    def allow_until(self, position: int | None) -> None:
        """Draft no token at absolute `position` or later (None: no limit)."""
        self.controls.allow_until.value = _UNLIMITED if position is None else position

    def receive(self, timeout_s: float | None = None) -> Any:
        """The next message; raises `DraftWorkerError` (and shuts the worker down) when the worker
        failed, died, or sent nothing for `timeout_s` seconds."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                return self._checked(self._get(POLL_S))
            except queue.Empty:
                if not self.alive:
                    self.close()
                    raise DraftWorkerError(f"the draft worker died ({self._exit_reason()})") from None
                if time.monotonic() > deadline:
                    self.close()
                    raise DraftWorkerError(
                        f"the draft worker sent nothing for {timeout_s or self.timeout_s:.0f} s:"
                        " it is hung or far too slow (raise `timeout_s` if drafting is that slow)"
                    ) from None

    def try_receive(self) -> Any | None:
        """The next message if one is there, else None (never waits)."""
        try:
            return self._checked(self._get(None))
        except queue.Empty:
            return None

    def _checked(self, message: Any) -> Any:
        if isinstance(message, Failed):
            self.close()
            raise DraftWorkerError(f"the drafter raised {message.kind} in the draft worker:\n{message.error}")
        if isinstance(message, DraftToken) and message.slot is not None:
            self.controls.read.value += 1
        return message

    def _exit_reason(self) -> str:
        return "no exception was reported"


class ThreadDraftWorker(DraftWorker):
    """The drafter in a thread of this process. torch releases the GIL inside ops, and OpenMP
    thread counts are per calling thread, so the drafter keeps its own `threads` budget."""

    def __init__(self, proposer: Proposer, threads: int | None, timeout_s: float, start_timeout_s: float):
        super().__init__(timeout_s, _Controls(_Value))
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        main = threading.main_thread()

        def run() -> None:
            if threads:
                torch.set_num_threads(threads)  # this thread's OpenMP budget only
            serve(proposer, self._inbox, self._outbox, self.controls, lambda p: (p, None), main.is_alive)

        self._thread = threading.Thread(target=run, name="pearl-draft", daemon=True)
        self._thread.start()
        ready = self.receive(start_timeout_s)
        assert isinstance(ready, Ready), ready

    def send(self, message):
        self._inbox.put(message)

    @property
    def alive(self):
        return self._thread.is_alive()

    def _get(self, timeout):
        return self._outbox.get(timeout=timeout) if timeout is not None else self._outbox.get_nowait()

    def probs_of(self, message):
        return message.probs

    def close(self):
        if self._thread.is_alive():
            self.controls.cancel_below.value = _UNLIMITED
            self._inbox.put(Stop())
            self._thread.join(_GRACE_S)
            if self._thread.is_alive():  # a thread cannot be killed; as a daemon it never blocks exit
                logger.warning("the draft thread did not stop within %.0f s; leaving it behind", _GRACE_S)


def _exit_when_orphaned(parent_alive: Callable[[], bool], done: threading.Event) -> None:
    """Until `done` is set, end this process as soon as its parent is gone."""
    while not done.wait(POLL_S):
        if not parent_alive():
            os._exit(0)  # nothing of this process is worth cleaning up: it has not started serving


def _process_main(pickled_proposer: bytes, inbox, outbox, controls, ring, threads) -> None:
    """Entry point of a draft process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    parent = mp.parent_process()
    parent_alive = parent.is_alive if parent else (lambda: True)
    # Loading the drafter takes seconds for a real model; a parent that dies meanwhile must not
    # leave it running to the end of its start-up. Once `serve` runs, it checks by itself.
    loaded = threading.Event()
    threading.Thread(target=_exit_when_orphaned, args=(parent_alive, loaded), daemon=True).start()
    if threads:
        torch.set_num_threads(threads)
    proposer = pickle.loads(pickled_proposer)
    loaded.set()
    slots = ring.shape[0] if ring is not None else 0
    written = [0]

    def emit(probs: torch.Tensor | None):
        if probs is None or ring is None:
            return None, None
        # Never overwrite a row the engine has not read yet (it reads messages in order).
        while written[0] - controls.read.value >= slots - 1 and parent_alive():
            time.sleep(_WAIT_S)
        slot = written[0] % slots
        written[0] += 1
        ring[slot].copy_(probs)
        return None, slot

    serve(proposer, inbox, outbox, controls, emit, parent_alive)


def _shutdown_process(process, inbox, outbox, controls, grace_s: float) -> None:
    """Stop a draft process: ask, then terminate, then kill. Used by `close` and at exit."""
    if process.is_alive():
        controls.cancel_below.value = _UNLIMITED
        try:
            inbox.put(Stop())
        except (OSError, ValueError):  # the queue is already closed
            pass
        process.join(grace_s)
    if process.is_alive():
        process.terminate()
        process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join(grace_s)
    for q in (inbox, outbox):
        q.cancel_join_thread()  # never block interpreter exit on undelivered messages
        q.close()


class ProcessDraftWorker(DraftWorker):
    """The drafter in a process of its own, with its own torch thread budget.

    The proposer is pickled into the child (torch moves its tensors to shared memory, so the
    weights are not copied twice). Draft distributions come back through a shared ring of
    `ring_slots` x V rows: a [V] tensor per message costs ~10 ms of shared-memory setup, a ring
    row ~1 ms. A drafter that drafts faster than the engine reads waits for free rows.
    """

    def __init__(
        self,
        proposer: Proposer,
        threads: int | None,
        timeout_s: float,
        start_timeout_s: float,
        ring_slots: int,
        start_method: str = "spawn",
    ):
        ctx = mp.get_context(start_method)
        super().__init__(timeout_s, _Controls(lambda v: ctx.Value("q", v, lock=False)))
        if ring_slots < 2:
            raise ValueError(f"ring_slots must be >= 2, got {ring_slots}")
        self._inbox = ctx.Queue()
        self._outbox = ctx.Queue()
        vocab = proposer.vocab_size
        self._ring = torch.zeros(ring_slots, vocab).share_memory_() if vocab else None
        # Pickled here, unpickled by the worker once it watches for its parent's death (the
        # tensors travel as shared memory, as through a queue).
        pickled = bytes(ForkingPickler.dumps(proposer))
        self._process = ctx.Process(
            target=_process_main,
            args=(pickled, self._inbox, self._outbox, self.controls, self._ring, threads),
            name="pearl-draft",
            daemon=True,  # multiprocessing terminates it when this interpreter exits
        )
        self._process.start()
        self._finalizer = weakref.finalize(
            self, _shutdown_process, self._process, self._inbox, self._outbox, self.controls, _GRACE_S
        )
        ready = self.receive(start_timeout_s)
        assert isinstance(ready, Ready), ready

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def send(self, message):
        self._inbox.put(message)

    @property
    def alive(self):
        return self._process.is_alive()

    def _get(self, timeout):
        return self._outbox.get(timeout=timeout) if timeout is not None else self._outbox.get_nowait()

    def probs_of(self, message):
        if message.slot is None:
            return message.probs
        return self._ring[message.slot].clone()

    def _exit_reason(self):
        return f"exit code {self._process.exitcode}"

    def close(self):
        self._finalizer()  # runs `_shutdown_process` once
