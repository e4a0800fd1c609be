"""The cost-model fit of ``asyncdp bench calibrate`` (spec routing-bench §5), pure: measured steps in, coefficients,
R² and the largest relative error out.

The model is ``t_step = a + b·P + c·D + d·K (+ e·E)`` in milliseconds, with P the prefill tokens of the step, D its
decoding sequences, K the sum over its sequences of their context after the step, and E = Σ p·(c0 + p/2) over
its prefill chunks (p tokens on c0 tokens of prior context: prefill attention). The fit is least squares in ms
(or, with ``relative``, in relative error) by modified Gram-Schmidt QR on columns scaled to unit maximum, so a
column in tokens and one in token pairs are equally well conditioned (numpy is not a dependency). A coefficient
that comes out negative is clamped to 0 and the remaining ones are refitted without it, until none is negative:
a step never gets cheaper with more work. A term whose column carries no information (all zero, or a
combination of the others) gets 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TERMS = ("a", "b", "c", "d", "e")
# The profile-file key of each coefficient (asyncdp.bench.profiles reads a to d; e is metadata until the
# simulator models prefill attention).
KEYS = {"a": "a_ms", "b": "b_ms_per_token", "c": "c_ms_per_seq", "d": "d_ms_per_kv_token",
        "e": "e_ms_per_token_pair"}


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computed: P prefill tokens, D decode sequences, K KV tokens read, E prefill token pairs."""

    P: int
    D: int
    K: int
    E: float = 0.0

    def row(self, terms: Sequence[str]) -> list[float]:
        values = {"a": 1.0, "b": float(self.P), "c": float(self.D), "d": float(self.K), "e": float(self.E)}
        return [values[t] for t in terms]


@dataclass(frozen=True, slots=True)
class Fit:
    coefficients: dict[str, float]  # term -> ms per unit; every term of the fit, clamped ones at 0
    clamped: tuple[str, ...]  # terms forced to 0 (negative in an unconstrained fit, or no information)
    predicted_ms: tuple[float, ...]  # aligned with the points
    r2: float
    max_rel_error: float

    def predict(self, work: StepWork) -> float:
        terms = tuple(self.coefficients)
        return sum(self.coefficients[t] * v for t, v in zip(terms, work.row(terms), strict=True))


def r_squared(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """1 - SS_res / SS_tot; 1.0 for a perfect fit, and for constant data fitted exactly."""
    mean = sum(measured) / len(measured)
    ss_tot = sum((y - mean) ** 2 for y in measured)
    ss_res = sum((y - p) ** 2 for y, p in zip(measured, predicted, strict=True))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def max_relative_error(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """max |predicted - measured| / measured over the points (measured times are positive)."""
    return max(abs(p - y) / y for y, p in zip(measured, predicted, strict=True))


def least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float | None]:
    """Unconstrained least squares; None for a column that adds nothing to the ones before it."""
    n = len(rows[0])
    scale = [max((abs(r[j]) for r in rows), default=0.0) or 1.0 for j in range(n)]
    cols = [[r[j] / scale[j] for r in rows] for j in range(n)]
    q: list[list[float]] = []
    r = [[0.0] * n for _ in range(n)]
    kept: list[int] = []
    for j in range(n):
        v = list(cols[j])
        norm0 = math.sqrt(sum(x * x for x in v))
        for k, qk in zip(kept, q, strict=True):
            r[k][j] = dot = sum(a * b for a, b in zip(qk, v, strict=True))
            v = [a - dot * b for a, b in zip(v, qk, strict=True)]
        norm = math.sqrt(sum(x * x for x in v))
        if norm <= 1e-9 * max(norm0, 1.0):
            continue  # dependent (or all zero): no information
        r[j][j] = norm
        q.append([x / norm for x in v])
        kept.append(j)
    qty = [sum(a * b for a, b in zip(qk, y, strict=True)) for qk in q]
    solution: dict[int, float] = {}
    for idx in range(len(kept) - 1, -1, -1):
        j = kept[idx]
        acc = qty[idx] - sum(r[j][kept[m]] * solution[kept[m]] for m in range(idx + 1, len(kept)))
        solution[j] = acc / r[j][j]
    return [solution[j] / scale[j] if j in solution else None for j in range(n)]


def fit(points: Sequence[StepWork], measured_ms: Sequence[float], *, with_e: bool = False,
        relative: bool = False) -> Fit:
    """Fit ``a + b·P + c·D + d·K`` (``+ e·E`` with ``with_e``) to the measured step times, coefficients >= 0.

    ``relative`` minimises the squared *relative* errors (each point weighted by 1 / its time) instead of the
    squared errors in ms, so small steps (the per-step constant ``a``) count as much as large ones."""
    if len(points) != len(measured_ms):
        raise ValueError(f"{len(points)} points for {len(measured_ms)} measurements")
    if not points:
        raise ValueError("no points to fit")
    if any(not t > 0 for t in measured_ms):
        raise ValueError("measured step times must be positive")
    terms = TERMS if with_e else TERMS[:4]
    active = list(terms)
    coef: dict[str, float] = dict.fromkeys(terms, 0.0)
    while active:
        rows = [p.row(active) for p in points]
        if relative:
            solved = least_squares([[v / y for v in r] for r, y in zip(rows, measured_ms, strict=True)],
                                   [1.0] * len(rows))
        else:
            solved = least_squares(rows, measured_ms)
        negative = [t for t, v in zip(active, solved, strict=True) if v is not None and v < 0]
        for t, v in zip(active, solved, strict=True):
            coef[t] = 0.0 if v is None or v < 0 else v
        active = [t for t, v in zip(active, solved, strict=True) if v is not None and v >= 0]
        if not negative:
            break
    clamped = tuple(t for t in terms if t not in active)
    predicted = tuple(sum(coef[t] * v for t, v in zip(terms, p.row(terms), strict=True)) for p in points)
    return Fit(coef, clamped, predicted, r_squared(measured_ms, predicted),
               max_relative_error(measured_ms, predicted))
