"""A progress bar over new tokens, driven by transformers' streamer protocol."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer


class TokenProgress(BaseStreamer):
    """A tqdm bar on stderr over new tokens: pass it as `streamer=` (the first `put` is the prompt).

    It shows only when stderr is a terminal (and `enabled`), so logs and pipes stay clean.
    """

    def __init__(self, total: int, enabled: bool = True, desc: str = "generating"):
        # disable=None: tqdm turns itself off when stderr is not a terminal.
        self.bar = tqdm(
            total=total, unit="tok", desc=desc, file=sys.stderr, leave=False, disable=None if enabled else True
        )
        self.prompt_seen = False

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.bar.update(int(value.numel()))

    def end(self) -> None:
        self.bar.close()
