"""Goodness of fit of sampled tokens to an exact distribution, for the statistical tests."""

from __future__ import annotations

import torch
from scipy.stats import chi2, ncx2

P_MIN = 1e-3  # a lossless sampler fails a test at this level once in 1000 seed sets; fixed seeds make it repeatable
POWER = 0.99  # the least power a statistical test states against the wrong distribution it guards against


def _bins(probs: torch.Tensor, n: float, min_expected: float) -> list[torch.Tensor]:
    """[V] bool masks of the chi-square cells: tokens expected `min_expected` times or more each
    have their own, the rest are pooled into one cell (joined to the smallest kept one when the
    pool is itself too small): the test's approximation needs it."""
    expected = probs.double() * n
    keep = (expected >= min_expected).nonzero()[:, 0].tolist()
    cells = [torch.arange(probs.numel()) == i for i in keep]
    rest = expected < min_expected
    if float(expected[rest].sum()) >= min_expected or not cells:
        cells.append(rest)
    else:
        smallest = min(range(len(cells)), key=lambda k: float(expected[cells[k]].sum()))
        cells[smallest] = cells[smallest] | rest
    return cells


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test that `counts` ([V] draws) come from `probs` ([V])."""
    n = float(counts.sum())
    cells = _bins(probs, n, min_expected)
    obs = torch.stack([counts.double()[c].sum() for c in cells])
    exp = torch.stack([probs.double()[c].sum() * n for c in cells])
    if (obs[exp <= 0] > 0).any():
        return 0.0  # a token of probability 0 was drawn
    obs, exp = obs[exp > 0], exp[exp > 0]
    statistic = float(((obs - exp) ** 2 / exp).sum())
    return float(chi2.sf(statistic, df=len(exp) - 1))


def chi_square_power(probs: torch.Tensor, wrong: torch.Tensor, n: int, min_expected: float = 5.0) -> float:
    """Power of `chi_square_p` at level P_MIN, with `n` draws, to reject `probs` ([V]) when the
    draws really come from `wrong` ([V]): the noncentral chi-square of Pearson's statistic."""
    cells = _bins(probs, n, min_expected)
    e = torch.stack([probs.double()[c].sum() for c in cells])
    w = torch.stack([wrong.double()[c].sum() for c in cells])
    df = len(cells) - 1
    noncentrality = float(n * ((w - e) ** 2 / e).sum())
    return float(ncx2.sf(chi2.isf(P_MIN, df), df, noncentrality))


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """TV distance between the empirical distribution of `counts` and `probs` (reported, not tested)."""
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def sample_counts(decoder, prompt: torch.Tensor, vocab_size: int, steps: int, n: int, temperature: float = 1.0):
    """([steps, V] counts of the first `steps` tokens, the n results) of n generations seeded 0..n-1."""
    from viasd_adapters.sampling import SamplingConfig

    counts, results = torch.zeros(steps, vocab_size), []
    for seed in range(n):
        out = decoder.generate(prompt, steps, SamplingConfig(temperature=temperature, seed=seed))
        counts[torch.arange(steps), torch.tensor(out.tokens)] += 1
        results.append(out)
    return counts, results
