"""Exact polynomial interpolation of sample tables in batch and seq (``table_families.py``'s step 3 and 6).

A derived kernel table's numeric cell is a polynomial in batch b and seq s, known at a few sample points. These
are the weights that turn the samples' values into the value at any (b, s): Lagrange weights in extended precision
(``lagrange_weights``), or, where the seq basis holds a non-polynomial term t(s) (tokens per expert), exact rational
weights of the seq samples (``exact_inverse`` of the samples' basis matrix, ``aux_weights``).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np


def lagrange_weights(points, sb, ss) -> np.ndarray:
    """Lagrange weights (P x len(sb)*3) of the sample values at the points (b, s), extended precision."""
    P = np.asarray(points, dtype=np.longdouble).reshape(-1, 2)
    b, s = P[:, 0], P[:, 1]
    def lagrange(x, xs):
        xs = [np.longdouble(v) for v in xs]
        out = []
        for j in range(len(xs)):
            w = np.ones_like(x)
            for m in range(len(xs)):
                if m != j:
                    w = w * (x - xs[m]) / (xs[j] - xs[m])
            out.append(w)
        return out

    lb, ls = lagrange(b, sb), lagrange(s, ss)       # one sample: the constant 1 (a fixed batch or seq)
    return np.stack([lb[i] * ls[j] for i in range(len(lb)) for j in range(len(ls))], axis=1)


def seq_basis(s: int, aux) -> list:
    """The seq part of the basis at one seq: 1, s, s^2, and t(s) for families with tokens per expert."""
    return [1, s, s * s, aux(s)]


def exact_inverse(rows: list[list]) -> list[list] | None:
    """Inverse of a small integer matrix in exact rationals (Gauss-Jordan), None if singular."""
    n = len(rows)
    a = [[Fraction(v) for v in r] + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(rows)]
    for c in range(n):
        piv = next((r for r in range(c, n) if a[r][c] != 0), None)
        if piv is None:
            return None
        a[c], a[piv] = a[piv], a[c]
        f = a[c][c]
        a[c] = [v / f for v in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0:
                g = a[r][c]
                a[r] = [x - g * y for x, y in zip(a[r], a[c])]
    return [r[n:] for r in a]


def aux_weights(points, sb, ss, aux, inv) -> np.ndarray:
    """Like ``lagrange_weights`` with the seq basis {1, s, s^2, t(s)}: exact rational weights of the seq samples
    (``inv`` = inverse of the samples' basis matrix), Lagrange weights in batch, extended precision."""
    P = np.asarray(points, dtype=np.int64).reshape(-1, 2)
    ws = {}
    for s in {int(v) for v in P[:, 1]}:
        row = seq_basis(s, aux)
        w = [sum(Fraction(row[k]) * inv[k][j] for k in range(len(row))) for j in range(len(ss))]
        ws[s] = [np.longdouble(x.numerator) / np.longdouble(x.denominator) for x in w]
    ls = np.array([ws[int(s)] for s in P[:, 1]], dtype=np.longdouble)          # (P, len(ss))
    lb = lagrange_weights(np.c_[P[:, 0], np.ones(len(P))], sb, (1,))                   # (P, len(sb))
    return np.stack([lb[:, i] * ls[:, j] for i in range(len(sb)) for j in range(len(ss))], axis=1)
