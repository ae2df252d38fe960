"""Goodness of fit of sampled tokens to an exact distribution, for the statistical tests."""

from __future__ import annotations

import torch
from scipy.stats import chi2

P_MIN = 1e-3  # a lossless sampler fails a test at this level once in 1000 seed sets; fixed seeds make it repeatable


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test that `counts` ([V] draws) come from `probs` ([V]).

    Tokens expected fewer than `min_expected` times are pooled into one bin (the test's
    approximation needs it); the pooled bin joins the smallest kept one if it is itself too small.
    """
    n = float(counts.sum())
    expected = probs.double() * n
    observed = counts.double()
    keep = expected >= min_expected
    obs, exp = list(observed[keep]), list(expected[keep])
    rest_obs, rest_exp = float(observed[~keep].sum()), float(expected[~keep].sum())
    if rest_exp >= min_expected or not exp:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:
        i = min(range(len(exp)), key=lambda k: exp[k])
        obs[i] += rest_obs
        exp[i] += rest_exp
    obs, exp = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    if (exp <= 0).any():
        return 0.0 if (obs[exp <= 0] > 0).any() else 1.0
    statistic = float(((obs - exp) ** 2 / exp).sum())
    return float(chi2.sf(statistic, df=len(exp) - 1))


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """TV distance between the empirical distribution of `counts` and `probs` (reported, not tested)."""
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())
