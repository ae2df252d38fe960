"""The DIMR objective: how far a routing mask's slim distribution u is from the full q.

`Reference` runs the full target once over the calibration texts (teacher-forced) and keeps
what every later evaluation needs: log q at the scored positions and the hidden states entering
every decoder layer. A mask that first touches layer p starts from the cached input of layer p
(prefix reuse), so it pays only for layers [p, L) and the LM head.

`MaskObjective` is a pure function of the mask: same mask, same metrics (no sampling, no state
that changes what it returns; results are memoised by mask).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..routing import HiddenState, RoutingMask, SlimModel
from .calibration import CalibrationSet, as_tensors

COSTS = ("kl", "disagreement")


@dataclass(frozen=True)
class MaskMetrics:
    """How closely the slim verifier of one mask follows the full target on calibration text."""

    kl: float  # mean over scored positions of KL(q || u), nats
    top1: float  # share of scored positions where argmax u == argmax q
    num_positions: int  # scored positions averaged over
    seconds: float = field(default=0.0, compare=False)  # wall time of the evaluation

    def cost(self, kind: str) -> float:
        """The number the search minimises: "kl" or "disagreement" (1 - top1)."""
        if kind == "kl":
            return self.kl
        if kind == "disagreement":
            return 1.0 - self.top1
        raise ValueError(f"cost {kind!r} is not one of {COSTS}")

    def to_dict(self) -> dict:
        return {"kl": self.kl, "top1": self.top1, "num_positions": self.num_positions, "seconds": self.seconds}


@dataclass
class _TextReference:
    layer_inputs: list[torch.Tensor]  # L + 1 tensors [1, T - 1, H]: input of layer i (index L: after the last)
    log_q: torch.Tensor  # [m, V] float32 log-probabilities of the full model at the scored positions
    top_q: torch.Tensor  # [m] argmax q


class Reference:
    """The full target's view of the calibration texts, computed once."""

    def __init__(self, target: PreTrainedModel, calibration: CalibrationSet, progress: bool = True):
        self.target = target
        self.calibration = calibration
        full = SlimModel(target, RoutingMask.none())
        self.num_layers = full.num_layers
        self.texts: list[_TextReference] = []
        begin = time.perf_counter()
        with torch.inference_mode():
            for ids, text in zip(tqdm(as_tensors(calibration.texts, full.device), desc="full-model reference",
                                      disable=not progress), calibration.texts):
                # Feed all but the last token: position j predicts token j + 1, so the last m
                # positions predict the m scored tokens.
                state = full.embed(ids[:, :-1], 0)
                inputs = [state.hidden]
                for i in range(self.num_layers):
                    state = full.run_layers(state, None, stop=i + 1)
                    inputs.append(state.hidden)
                log_q = torch.log_softmax(full.head(state, text.num_scored)[0].float(), dim=-1)  # [m, V]
                self.texts.append(_TextReference(inputs, log_q, log_q.argmax(-1)))
        self.seconds = time.perf_counter() - begin


def slim_log_probs(slim: SlimModel, reference: Reference, index: int) -> torch.Tensor:
    """[m, V] float32 log u at the scored positions of calibration text `index` (prefix reused)."""
    text = reference.texts[index]
    p = slim.num_prefix_layers
    state = HiddenState(text.layer_inputs[p], 0, p)
    m = text.log_q.shape[0]
    return torch.log_softmax(slim.head(slim.run_layers(state, None), m)[0].float(), dim=-1)


def compare(log_q: torch.Tensor, log_u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position KL(q || u) and top-1 agreement of two [m, V] log-distributions."""
    kl = (log_q.exp() * (log_q - log_u)).sum(-1)  # [m]
    agree = log_q.argmax(-1) == log_u.argmax(-1)  # [m]
    return kl, agree


class MaskObjective:
    """mask -> MaskMetrics on the reference's calibration texts (memoised, deterministic)."""

    def __init__(self, reference: Reference):
        self.reference = reference
        self.target = reference.target
        self.num_layers = reference.num_layers
        self.memo: dict[tuple, MaskMetrics] = {}  # RoutingMask.skips -> metrics
        self.evaluations = 0  # masks actually evaluated (memo misses)
        self.on_evaluated: Callable[[RoutingMask, MaskMetrics], None] | None = None  # e.g. a store's append

    def __call__(self, mask: RoutingMask) -> MaskMetrics:
        key = self._key(mask)
        if key not in self.memo:
            self.memo[key] = self.evaluate(mask)
            self.evaluations += 1
            if self.on_evaluated is not None:
                self.on_evaluated(mask, self.memo[key])
        return self.memo[key]

    def remember(self, mask: RoutingMask, metrics: MaskMetrics) -> None:
        """Seed the memo with a result computed earlier (e.g. by a resumed search)."""
        self.memo.setdefault(self._key(mask), metrics)

    def _key(self, mask: RoutingMask) -> tuple:
        mask.check_fits(self.num_layers)
        return mask.skips

    def evaluate(self, mask: RoutingMask) -> MaskMetrics:
        begin = time.perf_counter()
        slim = SlimModel(self.target, mask)
        kls, agrees = [], []
        with torch.inference_mode():
            for i, text in enumerate(self.reference.texts):
                kl, agree = compare(text.log_q, slim_log_probs(slim, self.reference, i))
                kls.append(kl)
                agrees.append(agree)
        kl, agree = torch.cat(kls), torch.cat(agrees)
        return MaskMetrics(float(kl.mean()), float(agree.float().mean()), kl.numel(), time.perf_counter() - begin)


class EvaluationStore:
    """Every evaluated mask of one (target, calibration set), appended to a JSON-lines file.

    A search, the sensitivity table, greedy removal and later runs (other budgets, a resumed
    search) all read it, so no mask is evaluated twice on the same calibration text.
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path).expanduser() if path else None

    def load_into(self, objective: MaskObjective) -> int:
        """Seed `objective`'s memo with the stored results; returns how many were read."""
        if self.path is None or not self.path.is_file():
            return 0
        count = 0
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            mask = RoutingMask(row["skip_layers"], row["skip_attention"], row["skip_mlp"])
            objective.remember(mask, MaskMetrics(row["kl"], row["top1"], row["num_positions"], row["seconds"]))
            count += 1
        return count

    def attach(self, objective: MaskObjective) -> MaskObjective:
        """Load the stored results, then append each new evaluation of `objective` to the file."""
        self.load_into(objective)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            objective.on_evaluated = self.append
        return objective

    def append(self, mask: RoutingMask, metrics: MaskMetrics) -> None:
        row = {"skip_layers": list(mask.skip_layers), "skip_attention": list(mask.skip_attention),
               "skip_mlp": list(mask.skip_mlp), **metrics.to_dict()}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
