"""PEARL (Liu et al., "Parallel Speculative Decoding with Adaptive Draft Length", ICLR 2025):
an engine that drafts and verifies at the same time, with pre-verify and post-verify.

The engine knows nothing of models: a `Proposer` drafts one token at a time inside a draft
worker (a thread or a process), and a `Judge` verifies blocks in the calling process.
"""

from .engine import BACKENDS, PearlConfig, PearlEngine, Round, Session
from .protocol import Judge, Judgement, Proposer, position_seed
from .workers import DraftWorkerError

__all__ = [
    "BACKENDS",
    "DraftWorkerError",
    "Judge",
    "Judgement",
    "PearlConfig",
    "PearlEngine",
    "Proposer",
    "Round",
    "Session",
    "position_seed",
]
