"""Console entry points: thin `@hydra.main` wrappers around plain `run(cfg)` functions."""

from pathlib import Path

import torch

# Absolute, so console scripts find the repository's conf/ whatever their working directory.
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for this process; None keeps torch's default (all cores).
    On a busy host 1 thread is often faster: a 2-thread op waits for its slower thread."""
    if threads:
        torch.set_num_threads(int(threads))
