"""A loss rate with its 95 % confidence interval (Wilson score). Pure.

The Wilson interval (Wilson 1927; Brown, Cai & DasGupta 2001) stays inside [0, 1]
and keeps its coverage for small counts, where the normal approximation says "0 %
loss, +/- 0" after a run without a loss. The verdict decides by the interval, not the
point estimate, so one packet more or less cannot swing it across a threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054  # two-sided 95 %: the 0.975 quantile of the standard normal


def wilson_interval(lost: int, sent: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) for ``lost`` of ``sent``; (0, 1) when nothing was sent."""
    if not 0 <= lost <= sent:
        raise ValueError(f"lost {lost} of {sent}: need 0 <= lost <= sent")
    if sent == 0:
        return 0.0, 1.0
    p = lost / sent
    z2n = z * z / sent
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / sent + z2n / (4 * sent))
    low = 0.0 if lost == 0 else max(0.0, centre - half)  # exact ends, no rounding dust
    high = 1.0 if lost == sent else min(1.0, centre + half)
    return low, high


@dataclass(frozen=True)
class LossEstimate:
    lost: int
    sent: int

    @property
    def fraction(self) -> float:
        return self.lost / self.sent if self.sent else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.lost, self.sent)

    def describe(self) -> str:
        """``0.52% (95% CI 0.33-0.80%, 5012 packets)``"""
        low, high = self.interval
        return (
            f"{_pct(self.fraction)} (95% CI {_pct(low, unit=False)}-{_pct(high)}, "
            f"{self.sent} packets)"
        )


NO_LOSS = LossEstimate(0, 0)


def round_trip(one_way: float) -> float:
    """The round-trip loss of two directions that each lose ``one_way``."""
    return 1 - (1 - one_way) ** 2


def _pct(fraction: float, *, unit: bool = True) -> str:
    return f"{fraction * 100:.2f}" + ("%" if unit else "")
