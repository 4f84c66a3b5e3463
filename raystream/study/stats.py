"""The study's statistics, from numpy and scipy rather than by hand:

- `mean`, `std`: of a cell's values over seeds (numpy; the sample standard deviation, ddof=1; 0 for one value,
  None for none), as the report, matched drift and the map all show them;
- `spearman`: Spearman's rank correlation (scipy.stats.spearmanr, ties at their mean rank) with its exact
  two-sided permutation p-value (scipy.stats.permutation_test over every ordering of one side: the share of
  orderings whose |rho| is at least the observed one).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence, Tuple

import numpy as np

EXACT_UP_TO = 8  # values: 8! = 40,320 orderings, the most an exact p-value enumerates


def mean(vals: Sequence[float]) -> Optional[float]:
    """The mean of `vals`; None when there are none."""
    return float(np.mean(vals)) if len(vals) else None


def std(vals: Sequence[float]) -> Optional[float]:
    """The sample standard deviation of `vals` (ddof=1); 0.0 for a single value, None for none."""
    if len(vals) < 2:
        return 0.0 if len(vals) else None
    return float(np.std(vals, ddof=1))


def mean_std(vals: Sequence[float]) -> Tuple[float, float]:
    """(mean, std) of at least one value."""
    return mean(vals), std(vals)


def spearman(x: Sequence[float], y: Sequence[float]) -> Tuple[float, Optional[float]]:
    """(rho, p): Spearman's rank correlation of x and y, and the share of all orderings of y whose |rho| is at least
    as large (exact; None for more than EXACT_UP_TO values). rho is nan (p None) where either side is constant."""
    from scipy import stats  # lazy: scipy only when a map is ranked

    with warnings.catch_warnings():  # a constant side: rho is nan, said by the caller's table
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        rho = float(stats.spearmanr(x, y).statistic)
    if math.isnan(rho) or len(x) > EXACT_UP_TO:
        return rho, None
    rx = stats.rankdata(x)

    def abs_rho(ranks_y, axis=-1):
        return np.abs(stats.pearsonr(np.broadcast_to(rx, ranks_y.shape), ranks_y, axis=axis).statistic)

    test = stats.permutation_test((stats.rankdata(y),), abs_rho, permutation_type="pairings", vectorized=True,
                                  n_resamples=np.inf, alternative="greater")
    return rho, float(test.pvalue)
