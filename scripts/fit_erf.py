"""Derive the float32 erf coefficients used in onnxpy/ops/_erf.py.

erf(x) ~= x * P(x^2) / Q(x^2) on [-4, 4] (erf is 1 to float32 precision beyond), with deg P = 6,
deg Q = 5, Q(0) = 1: a linearized least-squares rational fit against math.erf at Chebyshev
points, reweighted by 1/Q a few times. Prints the coefficients and the float32 error.
"""

from __future__ import annotations

import math

import numpy as np

C = 4.0


def fit(dp: int = 6, dq: int = 5, n: int = 2000, iters: int = 8) -> tuple[np.ndarray, np.ndarray]:
    x = C * (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n))
    u = x * x
    f = np.array([math.erf(v) / v for v in x])
    w = np.ones(n)
    for _ in range(iters):
        a = np.hstack(
            [np.vander(u, dp + 1, increasing=True), -f[:, None] * np.vander(u, dq + 1, increasing=True)[:, 1:]]
        )
        sol, *_ = np.linalg.lstsq(a * (w * x)[:, None], f * w * x, rcond=None)
        p, q = sol[: dp + 1], np.concatenate([[1.0], sol[dp + 1 :]])
        w = 1 / np.abs(np.polynomial.polynomial.polyval(u, q))
    return p, q


if __name__ == "__main__":
    p, q = fit()
    print("P =", [float(np.float32(v)) for v in p])
    print("Q =", [float(np.float32(v)) for v in q])
    xs = np.linspace(-6, 6, 200001).astype(np.float32)
    xc = np.clip(xs, -C, C)
    u = xc * xc
    num = np.polynomial.polynomial.polyval(u, p.astype(np.float32)).astype(np.float32)
    den = np.polynomial.polynomial.polyval(u, q.astype(np.float32)).astype(np.float32)
    got = np.clip(xc * num / den, -1, 1)
    ref = np.array([math.erf(v) for v in xs.astype(np.float64)])
    print("max abs error (float32):", float(np.max(np.abs(got - ref))))
