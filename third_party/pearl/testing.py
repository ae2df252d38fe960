"""A toy drafter and target over integer tokens, to test the engine without models.

The target's greedy next token is a fixed function of the sequence (`toy_next`); the toy
drafter agrees with it except at positions where `position % error_every == 0`. Both can be
slowed down, and the drafter can be told to fail or hang, to test scheduling and shutdown.
They live in the package (not in a test file) so a spawned draft process can unpickle them.
"""

from __future__ import annotations

import os
import time

import torch

from .protocol import Judgement


def toy_next(ids: torch.Tensor, vocab_size: int) -> int:
    """The toy target's token after `ids` ([T] long)."""
    T = ids.numel()
    last = int(ids[-1])
    before = int(ids[-2]) if T > 1 else 0
    return (31 * last + 17 * before + T) % vocab_size


def toy_reference(prompt: torch.Tensor, num_tokens: int, vocab_size: int) -> list[int]:
    """Greedy autoregressive decoding of the toy target: what PEARL must reproduce."""
    ids = prompt[0].clone()
    out = []
    for _ in range(num_tokens):
        token = toy_next(ids, vocab_size)
        out.append(token)
        ids = torch.cat([ids, ids.new_tensor([token])])
    return out


class ToyProposer:
    """Drafts `toy_next`, wrong at every `error_every`-th position (0: never wrong)."""

    def __init__(
        self,
        vocab_size: int = 50,
        error_every: int = 3,
        sleep_s: float = 0.0,
        fail_after: int | None = None,
        hang_after: int | None = None,
        with_probs: bool = False,
        load_s: float = 0.0,
    ):
        self._vocab_size = vocab_size
        self.error_every = error_every
        self.sleep_s = sleep_s  # time per drafted token
        self.fail_after = fail_after  # raise ValueError on the call after this many
        self.hang_after = hang_after  # sleep for an hour on the call after this many
        self.with_probs = with_probs  # return one-hot distributions
        self.load_s = load_s  # unpickling (a draft worker loading it) takes this long, like a real drafter
        self.calls = 0
        self.log: list[tuple[float, int]] = []  # (monotonic time, position) of every draft

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.load_s:
            time.sleep(self.load_s)

    def reset(self, settings) -> None:
        self.calls = 0

    def propose(self, ids: torch.Tensor, seed: int):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise ValueError(f"toy drafter failure in process {os.getpid()}")
        if self.hang_after is not None and self.calls > self.hang_after:
            time.sleep(3600)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        position = ids.shape[1]
        self.log.append((time.monotonic(), position))
        token = toy_next(ids[0], self._vocab_size)
        if self.error_every and position % self.error_every == 0:
            token = (token + 1) % self._vocab_size
        probs = None
        if self.with_probs:
            probs = torch.zeros(self._vocab_size)
            probs[token] = 1.0
        return token, probs

    def stats(self) -> dict:
        return {"toy-draft": self.calls, "pid": os.getpid()}


class ToyJudge:
    """Greedy verification against `toy_next`; records the block sizes it saw."""

    def __init__(self, vocab_size: int = 50, sleep_s: float = 0.0, interrupt_on_call: int | None = None):
        self.vocab_size = vocab_size
        self.sleep_s = sleep_s  # time per judgement (one target forward)
        self.interrupt_on_call = interrupt_on_call  # raise KeyboardInterrupt on this call (1-based)
        self.blocks: list[int] = []  # K of every call
        self.log: list[tuple[float, int]] = []  # (monotonic time at return, committed length T) of every call

    def judge(self, ids: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None) -> Judgement:
        self.blocks.append(tokens.numel())
        if self.interrupt_on_call is not None and len(self.blocks) == self.interrupt_on_call:
            raise KeyboardInterrupt
        if self.sleep_s:
            time.sleep(self.sleep_s)
        seq = ids[0]
        K = tokens.numel()
        for i in range(K + 1):
            target = toy_next(seq, self.vocab_size)
            if i == K or int(tokens[i]) != target:
                out = torch.cat([tokens[:i], tokens.new_tensor([target])])
                self.log.append((time.monotonic(), ids.shape[1]))
                return Judgement(out, i, K, {"full": min(i + 1, K)})
            seq = torch.cat([seq, tokens[i : i + 1]])
        raise AssertionError("unreachable")
