"""Confidence intervals of a mean: percentile bootstrap (default) or Student-t."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def summarize(values: list[float | None], method: str = "bootstrap", level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> dict[str, Any]:
    """``{"mean", "low", "high", "std", "n"}`` over the values that are not None (``mean: None`` when none are).

    One value gives a zero-width interval; the bootstrap draws ``resamples`` resamples from ``seed``, so the
    same values always give the same interval."""
    xs = np.asarray([float(v) for v in values if v is not None], dtype=np.float64)
    n = int(xs.size)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "std": None, "n": 0}
    mean = float(xs.mean())
    std = float(xs.std(ddof=1)) if n > 1 else 0.0
    if n == 1 or std == 0.0:
        low = high = mean
    elif method == "bootstrap":
        rng = np.random.default_rng(seed)
        means = xs[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
        alpha = (1.0 - level) / 2
        low, high = (float(q) for q in np.quantile(means, [alpha, 1 - alpha]))
    elif method == "t":
        half = t_quantile((1 + level) / 2, n - 1) * std / math.sqrt(n)
        low, high = mean - half, mean + half
    else:
        raise ValueError(f"interval method {method!r} is neither 'bootstrap' nor 't'")
    return {"mean": mean, "low": low, "high": high, "std": std, "n": n}


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes, modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
