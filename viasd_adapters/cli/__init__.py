"""Console entry points: thin `@hydra.main` wrappers around plain `run(cfg)` functions."""
import torch

from ..conf import CONFIG_DIR  # noqa: F401  (re-exported for the entry points)


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for this process; None keeps torch's default (all cores).
    On a busy host 1 thread is often faster: a 2-thread op waits for its slower thread."""
    if threads:
        torch.set_num_threads(int(threads))
