"""Gilbert-Elliott two-state loss model, one decision per packet.

State G (good) and B (bad). Before each packet the chain steps once:
G→B with probability ``p``, B→G with probability ``r``. A packet is then lost with
probability ``loss_in_good`` in G and ``loss_in_bad`` in B. With the classic
Gilbert settings (loss_in_good = 0, loss_in_bad = 1) the mean burst length is
``1 / r`` packets and the average loss ``p / (p + r)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GilbertElliottParams:
    p: float = 0.0
    r: float = 1.0
    loss_in_good: float = 0.0
    loss_in_bad: float = 1.0

    @classmethod
    def from_burst(cls, mean_burst_packets: float, average_loss: float) -> GilbertElliottParams:
        """Classic Gilbert chain with the given mean burst length and average loss."""
        if mean_burst_packets < 1.0:
            raise ValueError("mean burst length must be >= 1 packet")
        if not 0.0 <= average_loss < 1.0:
            raise ValueError("average loss must be in [0, 1)")
        r = 1.0 / mean_burst_packets
        p = average_loss * r / (1.0 - average_loss)
        return cls(p=p, r=r)

    @property
    def enabled(self) -> bool:
        return self.p > 0.0 or self.loss_in_good > 0.0

    @property
    def average_loss(self) -> float:
        """Stationary loss probability of the chain."""
        if self.p + self.r == 0.0:
            return self.loss_in_good
        bad = self.p / (self.p + self.r)
        return bad * self.loss_in_bad + (1.0 - bad) * self.loss_in_good


class GilbertElliott:
    """Seeded Gilbert-Elliott chain; starts in the good state."""

    def __init__(self, params: GilbertElliottParams, rng: random.Random) -> None:
        self.params = params
        self._rng = rng
        self.in_bad = False

    def lose(self) -> bool:
        """Advance one packet; True when that packet is lost."""
        params = self.params
        draw = self._rng.random()
        if self.in_bad:
            if draw < params.r:
                self.in_bad = False
        elif draw < params.p:
            self.in_bad = True
        loss = params.loss_in_bad if self.in_bad else params.loss_in_good
        if loss <= 0.0:
            return False
        if loss >= 1.0:
            return True
        return self._rng.random() < loss
