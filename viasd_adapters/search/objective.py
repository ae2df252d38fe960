"""The DIMR objective: how far a routing mask's slim distribution u is from the full q.

`Reference` runs the full target once over the calibration texts (teacher-forced) and keeps
what every later evaluation needs: log q at the scored positions and the hidden states entering
every decoder layer. A mask that first touches layer p starts from the cached input of layer p
(prefix reuse), so it pays only for layers [p, L) and the LM head.

`MaskObjective` is a pure function of the mask: same mask, same metrics (no sampling, no state
that changes what it returns; results are memoised by mask).

Two kinds of cost can be minimised. "kl" (and "disagreement") measure distance at a fixed budget.
"expected" (`ExpectedCost`) is what a mask costs VIA-SD: a slim pass per verify block plus a full
pass for the blocks the slim tier cannot settle, both priced by a measured latency profile
(`viasd_adapters.costs.CostModel`), with a penalty when the slim tier settles too many tokens wrongly.
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

from ..costs import CostModel
from ..routing import HiddenState, RoutingMask, SlimModel
from ..verify.policy import ConfidencePolicy, Tier, TierPolicy
from .calibration import CalibrationSet, as_tensors

COSTS = ("kl", "disagreement", "expected")
_EXPECTED_FIELDS = ("settled", "wrong", "block_cost", "expected")


@dataclass(frozen=True)
class MaskMetrics:
    """How closely the slim verifier of one mask follows the full target on calibration text."""

    kl: float  # mean over scored positions of KL(q || u), nats
    top1: float  # share of scored positions where argmax u == argmax q
    num_positions: int  # scored positions averaged over
    seconds: float = field(default=0.0, compare=False)  # wall time of the evaluation
    # With an `ExpectedCost` (None otherwise):
    settled: float | None = None  # share of verify blocks the slim tier settles without the full model
    wrong: float | None = None  # share of positions where u is confident (acts) but argmax u != argmax q
    block_cost: float | None = None  # expected verify cost per block, in full forwards (SD's: 1)
    expected: float | None = None  # block_cost plus the penalty for `wrong` over the quality constraint

    def cost(self, kind: str) -> float:
        """The number the search minimises: "kl", "disagreement" (1 - top1) or "expected"."""
        if kind == "kl":
            return self.kl
        if kind == "disagreement":
            return 1.0 - self.top1
        if kind == "expected":
            if self.expected is None:
                raise ValueError("cost 'expected' needs an objective built with an ExpectedCost (search.expected)")
            return self.expected
        raise ValueError(f"cost {kind!r} is not one of {COSTS}")

    def to_dict(self) -> dict:
        out = {"kl": self.kl, "top1": self.top1, "num_positions": self.num_positions, "seconds": self.seconds}
        out.update({k: getattr(self, k) for k in _EXPECTED_FIELDS if getattr(self, k) is not None})
        return out

    @classmethod
    def from_dict(cls, row: dict) -> MaskMetrics:
        return cls(
            row["kl"],
            row["top1"],
            row["num_positions"],
            row.get("seconds", 0.0),
            *(row.get(k) for k in _EXPECTED_FIELDS),
        )


def block_outcomes(
    log_q: torch.Tensor, log_u: torch.Tensor, policy: TierPolicy, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which verify blocks the slim tier would settle, and where it would act wrongly.

    The calibration text is the target's own greedy continuation, so the draft is taken to be the
    target itself: its token at each position is x = argmax q and its distribution p = q (a draft
    that agrees with the target; real drafts agree less, which only adds escalations). Per
    position the policy's own greedy rule (`TierPolicy.assign`, as `TieredVerifier` applies it)
    says whether tier 1 accepts x, tier 2 rewrites it with u's token, or the block escalates. A
    block of `block` tokens starting at each position settles when its first non-accepted token
    is rewritten by tier 2 (or every token is accepted).

    Args:
        log_q, log_u: [m, V] log-distributions at the scored positions.
        policy: the tier rule whose thresholds the mask is chosen for.
        block: K, draft tokens per verify block.
    Returns:
        settled: [max(m - block + 1, 0)] bool, per block start;
        wrong: [m] bool, u would act but argmax u != argmax q: tier 2 rewrites with u's token, or
            tier 1 would accept u's token y = argmax u had a draft proposed it (with the
            target's confidence q(y) as the draft's).
    """
    q, u = log_q.exp(), log_u.exp()  # [m, V]
    x = log_q.argmax(-1)  # [m]
    y = u.argmax(-1)  # [m]
    tiers = policy.assign(x, q, u)  # [m]
    accept = tiers == Tier.ACCEPT.code  # [m]
    rewrite = tiers == Tier.SLIM.code  # [m]
    wrong = (y != x) & (rewrite | (policy.assign(y, q, u) == Tier.ACCEPT.code))  # [m]
    m = x.numel()
    starts = max(m - block + 1, 0)
    if starts == 0:
        return torch.zeros(0, dtype=torch.bool, device=x.device), wrong
    windows = accept.unfold(0, block, 1)  # [starts, block]
    all_accepted = windows.all(-1)  # [starts]
    first = (~windows).float().argmax(-1)  # [starts]: first non-accepted offset (0 when all accepted)
    settled = all_accepted | rewrite[torch.arange(starts, device=x.device) + first]
    return settled, wrong


@dataclass
class ExpectedCost:
    """The cost-aware DIMR objective: expected verify cost per block under a quality constraint.

    Per verify block of `block` draft tokens, VIA-SD pays one slim forward (`slim_ratio` of a full
    forward of the same size) and, for the blocks the slim tier cannot settle, an escalation:
    a full forward, or with `share_prefix` only the target's layers [p, L) and head over the
    slim pass's stored layer-p states. With settled share s:

        block_cost = slim_ratio + (1 - s) * escalation_ratio        (SD pays 1.0)
        expected   = block_cost + penalty * max(0, wrong - max_wrong)

    The ratios come from a `CostModel` fitted on the device's latency profile, so a mask is priced by the
    layers it runs there (late masks make escalations cheap when the prefix is shared; masks of
    many layers make the slim pass cheap but settle less).
    """

    profile: CostModel  # the target's forwards, priced by layers run
    attention_share: float = 0.5  # share of a layer's cost in its attention sub-block
    tau_accept: float = 0.8  # the tier thresholds the mask is chosen for (`ConfidencePolicy`'s)
    tau_slim: float = 0.8  # tier 2 rewrites with u's token where max u exceeds it
    block: int = 5  # K, draft tokens per verify block
    max_wrong: float = 0.02  # quality constraint: share of positions the slim tier may get wrong
    penalty: float = 10.0  # block-cost units per unit of `wrong` over the constraint
    share_prefix: bool = True  # escalations reuse the slim pass's layers [0, p)
    tau_draft: float = 0.0  # the draft's confidence tier 1 also needs (0: ignored)

    def __post_init__(self) -> None:
        self.policy  # noqa: B018 -- refuses thresholds outside [0, 1] here, not at the first evaluation

    @property
    def policy(self) -> ConfidencePolicy:
        """The tier rule these thresholds make, the one the verifier will run."""
        return ConfidencePolicy(tau_accept=self.tau_accept, tau_draft=self.tau_draft, tau_slim=self.tau_slim)

    def ratios(self, mask: RoutingMask, num_layers: int) -> tuple[float, float]:
        """(slim forward, escalation) cost, each relative to one full forward of K + 1 tokens."""
        n = self.block + 1
        full = self.profile.forward_ms("target", n)
        slim = self.profile.forward_ms("slim", n, slim=num_layers - mask.skipped_cost(self.attention_share))
        p = mask.num_prefix_layers(num_layers) if self.share_prefix else 0
        escalate = self.profile.forward_ms("slim", n, slim=num_layers - p) if p else full
        return slim / full, escalate / full

    def key(self) -> str:
        """What makes two evaluations comparable (a store row of another setting is not reused)."""
        # tau_draft joins the key only when set, so rows stored before it existed stay comparable
        draft = f":draft{self.tau_draft}" if self.tau_draft else ""
        return (
            f"expected:{self.profile.device}:{self.tau_accept}:{self.tau_slim}:{self.block}:{self.max_wrong}:"
            f"{self.penalty}:{self.share_prefix}:{self.attention_share:.4f}{draft}"
        )


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
            for ids, text in zip(
                tqdm(as_tensors(calibration.texts, full.device), desc="full-model reference", disable=not progress),
                calibration.texts,
            ):
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

    def __init__(self, reference: Reference, expected: ExpectedCost | None = None):
        self.reference = reference
        self.expected = expected  # None: kl / disagreement only
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
        kls, agrees, settled, wrong = [], [], [], []
        e = self.expected
        policy = e.policy if e is not None else None
        with torch.inference_mode():
            for i, text in enumerate(self.reference.texts):
                log_u = slim_log_probs(slim, self.reference, i)
                kl, agree = compare(text.log_q, log_u)
                kls.append(kl)
                agrees.append(agree)
                if e is not None:
                    s, w = block_outcomes(text.log_q, log_u, policy, e.block)
                    settled.append(s)
                    wrong.append(w)
        kl, agree = torch.cat(kls), torch.cat(agrees)
        extra = {}
        if e is not None:
            s_share = float(torch.cat(settled).float().mean()) if sum(x.numel() for x in settled) else 0.0
            w_share = float(torch.cat(wrong).float().mean())
            slim_ratio, escalate_ratio = e.ratios(mask, self.num_layers)
            block_cost = slim_ratio + (1 - s_share) * escalate_ratio
            extra = {
                "settled": s_share,
                "wrong": w_share,
                "block_cost": block_cost,
                "expected": block_cost + e.penalty * max(0.0, w_share - e.max_wrong),
            }
        return MaskMetrics(
            float(kl.mean()), float(agree.float().mean()), kl.numel(), time.perf_counter() - begin, **extra
        )


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
            if row.get("expected_key") != _expected_key(objective):
                continue  # evaluated for another cost setting: its expected-cost fields do not apply
            mask = RoutingMask(row["skip_layers"], row["skip_attention"], row["skip_mlp"])
            objective.remember(mask, MaskMetrics.from_dict(row))
            count += 1
        return count

    def attach(self, objective: MaskObjective) -> MaskObjective:
        """Load the stored results, then append each new evaluation of `objective` to the file."""
        self.load_into(objective)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            key = _expected_key(objective)
            objective.on_evaluated = lambda mask, metrics: self.append(mask, metrics, key)
        return objective

    def append(self, mask: RoutingMask, metrics: MaskMetrics, expected_key: str | None = None) -> None:
        row = {
            "skip_layers": list(mask.skip_layers),
            "skip_attention": list(mask.skip_attention),
            "skip_mlp": list(mask.skip_mlp),
            **metrics.to_dict(),
        }
        if expected_key is not None:
            row["expected_key"] = expected_key
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _expected_key(objective: MaskObjective) -> str | None:
    expected = getattr(objective, "expected", None)
    return expected.key() if expected is not None else None
