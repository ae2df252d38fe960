"""Draft workers: the drafter runs beside the target, in a thread or in a process of its own.

Both backends run the same loop (`serve`) and speak the messages of `protocol.py`. The engine
never blocks without a deadline: every wait polls with a timeout and checks that the worker is
alive, so a crashed, killed or hung worker becomes a `DraftWorkerError` in the caller. A process
worker ignores SIGINT (the caller decides what an interrupt means), and exits by itself when its
parent dies, so it is never orphaned.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
import traceback
import weakref
from abc import ABC, abstractmethod
from typing import Any, Callable

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


class DraftWorkerError(RuntimeError):
    """The draft worker failed, died or stopped answering; it has been shut down."""


class _Flag:
    """An int the engine raises to cancel rounds (same interface as a shared `mp.Value`)."""

    def __init__(self) -> None:
        self.value = 0


def serve(
    proposer: Proposer,
    inbox,
    outbox,
    cancel_below,
    emit_probs: Callable[[torch.Tensor | None], tuple[torch.Tensor | None, int | None]],
    parent_alive: Callable[[], bool],
) -> None:
    """The worker loop: answer requests until `Stop`, or until the parent is gone.

    Draft rounds with `round_id < cancel_below.value` are abandoned between two tokens.
    """
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
                _draft(proposer, request, outbox, cancel_below, emit_probs)
            elif isinstance(request, ResetRequest):
                proposer.reset(request.settings)
            elif isinstance(request, StatsRequest):
                outbox.put(StatsReply(proposer.stats()))
            else:
                raise TypeError(f"unknown request {request!r}")
        except Exception as err:  # reported to the engine, which raises it in the caller
            outbox.put(Failed(type(err).__name__, traceback.format_exc()))
            return


def _draft(proposer: Proposer, request: DraftRequest, outbox, cancel_below, emit_probs) -> None:
    ids = request.prefix[None]  # [1, T]
    produced = 0
    while produced < request.num_tokens and request.round_id >= cancel_below.value:
        position = ids.shape[1]
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

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s

    @abstractmethod
    def send(self, message: Any) -> None:
        """Queue a request."""

    @abstractmethod
    def cancel_below(self, round_id: int) -> None:
        """Abandon every draft round with an id below `round_id`."""

    @property
    @abstractmethod
    def alive(self) -> bool:
        """Whether the worker still runs."""

    @abstractmethod
    def close(self) -> None:
        """Stop the worker and free what it holds; safe to call twice."""

    @abstractmethod
    def _get(self, timeout: float) -> Any:
        """The next message (raises `queue.Empty` after `timeout` seconds)."""

    @abstractmethod
    def probs_of(self, message: DraftToken) -> torch.Tensor | None:
        """The [V] distribution a `DraftToken` carries (copied out of shared buffers)."""

    def receive(self, timeout_s: float | None = None) -> Any:
        """The next message; raises `DraftWorkerError` (and shuts the worker down) when the worker
        failed, died, or sent nothing for `timeout_s` seconds."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                message = self._get(POLL_S)
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
                continue
            if isinstance(message, Failed):
                self.close()
                raise DraftWorkerError(f"the drafter raised {message.kind} in the draft worker:\n{message.error}")
            return message

    def _exit_reason(self) -> str:
        return "no exception was reported"


class ThreadDraftWorker(DraftWorker):
    """The drafter in a thread of this process. torch releases the GIL inside ops, and OpenMP
    thread counts are per calling thread, so the drafter keeps its own `threads` budget."""

    def __init__(self, proposer: Proposer, threads: int | None, timeout_s: float, start_timeout_s: float):
        super().__init__(timeout_s)
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._cancel = _Flag()
        main = threading.main_thread()

        def run() -> None:
            if threads:
                torch.set_num_threads(threads)  # this thread's OpenMP budget only
            serve(proposer, self._inbox, self._outbox, self._cancel, lambda p: (p, None), main.is_alive)

        self._thread = threading.Thread(target=run, name="pearl-draft", daemon=True)
        self._thread.start()
        ready = self.receive(start_timeout_s)
        assert isinstance(ready, Ready), ready

    def send(self, message):
        self._inbox.put(message)

    def cancel_below(self, round_id):
        self._cancel.value = max(self._cancel.value, round_id)

    @property
    def alive(self):
        return self._thread.is_alive()

    def _get(self, timeout):
        return self._outbox.get(timeout=timeout)

    def probs_of(self, message):
        return message.probs

    def close(self):
        if self._thread.is_alive():
            self._cancel.value = 1 << 62
            self._inbox.put(Stop())
            self._thread.join(self.timeout_s)
            if self._thread.is_alive():
                logger.warning("the draft thread did not stop in %.0f s; it is a daemon and is left behind", self.timeout_s)


def _process_main(proposer, inbox, outbox, cancel, ring, threads) -> None:
    """Entry point of a draft process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    if threads:
        torch.set_num_threads(threads)
    parent = mp.parent_process()
    slots = ring.shape[0] if ring is not None else 0
    counter = [0]

    def emit(probs: torch.Tensor | None):
        if probs is None or ring is None:
            return None, None
        slot = counter[0] % slots
        counter[0] += 1
        ring[slot].copy_(probs)
        return None, slot

    serve(proposer, inbox, outbox, cancel, emit, parent.is_alive if parent else (lambda: True))


def _shutdown_process(process, inbox, outbox, cancel, grace_s: float) -> None:
    """Stop a draft process: ask, then terminate, then kill. Used by `close` and at exit."""
    if process.is_alive():
        cancel.value = 1 << 62
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
    row ~1 ms.
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
        super().__init__(timeout_s)
        ctx = mp.get_context(start_method)
        self._inbox = ctx.Queue()
        self._outbox = ctx.Queue()
        self._cancel = ctx.Value("q", 0, lock=False)
        self._ring = torch.zeros(ring_slots, proposer.vocab_size).share_memory_() if ring_slots else None
        self._process = ctx.Process(
            target=_process_main,
            args=(proposer, self._inbox, self._outbox, self._cancel, self._ring, threads),
            name="pearl-draft",
            daemon=True,  # multiprocessing terminates it when this interpreter exits
        )
        self._process.start()
        self._finalizer = weakref.finalize(
            self, _shutdown_process, self._process, self._inbox, self._outbox, self._cancel, 5.0
        )
        ready = self.receive(start_timeout_s)
        assert isinstance(ready, Ready), ready

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def send(self, message):
        self._inbox.put(message)

    def cancel_below(self, round_id):
        self._cancel.value = max(self._cancel.value, round_id)

    @property
    def alive(self):
        return self._process.is_alive()

    def _get(self, timeout):
        return self._outbox.get(timeout=timeout)

    def probs_of(self, message):
        if message.slot is None:
            return message.probs
        return self._ring[message.slot].clone()

    def _exit_reason(self):
        return f"exit code {self._process.exitcode}"

    def close(self):
        self._finalizer()  # runs `_shutdown_process` once
