"""A small linear program solver: maximise ``sum(x)`` subject to ``A x <= b``, ``x >= 0``.

Enough for the plan's share problems (a few sites, one row per link), with no solver
dependency. Dense tableau simplex started at ``x = 0`` (feasible because ``b >= 0``),
Bland's rule (lowest index enters, lowest basic index leaves among ties), so it cannot
cycle on the degenerate vertices equal link rates make, and every site that solves the
same problem gets the same vertex.
"""

from __future__ import annotations

from collections.abc import Sequence

from wangate.errors import LocalProtocolError

EPS = 1e-12


def maximise_sum(rows: Sequence[Sequence[float]], limits: Sequence[float]) -> list[float]:
    """The vertex ``x`` that maximises ``sum(x)`` over ``rows @ x <= limits``, ``x >= 0``.

    Every limit must be finite and >= 0; the problem must be bounded (each variable in a
    row with a positive coefficient), else ``LocalProtocolError``."""
    m = len(rows)
    n = len(rows[0]) if rows else 0
    if any(len(r) != n for r in rows) or len(limits) != m:
        raise LocalProtocolError("linear program: ragged rows or limits")
    if not all(0.0 <= b < float("inf") for b in limits):
        raise LocalProtocolError(f"linear program: limits must be finite and >= 0: {limits}")
    # tableau rows: [A | I | b]; objective row: reduced costs, -sum(x) to minimise
    width = n + m + 1
    table = [[*map(float, r), *(1.0 if k == i else 0.0 for k in range(m)), float(b)]
             for i, (r, b) in enumerate(zip(rows, limits, strict=True))]  # fmt: skip
    cost = [-1.0] * n + [0.0] * (m + 1)
    basis = [n + i for i in range(m)]
    for _ in range(10_000):
        entering = next((j for j in range(n + m) if cost[j] < -EPS), None)
        if entering is None:
            break
        best: tuple[float, int, int] | None = None
        for i in range(m):
            a = table[i][entering]
            if a > EPS:
                key = (table[i][-1] / a, basis[i], i)
                if best is None or key[:2] < best[:2]:
                    best = key
        if best is None:
            raise LocalProtocolError("linear program: unbounded")
        row = best[2]
        pivot = table[row][entering]
        table[row] = [v / pivot for v in table[row]]
        for i in range(m):
            factor = table[i][entering]
            if i != row and factor != 0.0:
                table[i] = [v - factor * p for v, p in zip(table[i], table[row], strict=True)]
        factor = cost[entering]
        cost = [v - factor * p for v, p in zip(cost, table[row], strict=True)]
        basis[row] = entering
    else:  # pragma: no cover - Bland's rule terminates
        raise LocalProtocolError("linear program: no optimum after 10000 pivots")
    x = [0.0] * width
    for i, j in enumerate(basis):
        x[j] = table[i][-1]
    return [max(0.0, v) for v in x[:n]]
