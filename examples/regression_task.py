"""The small model and data the examples train: one regression task, sliced per trainer."""

from __future__ import annotations

import zlib

import numpy as np
import torch


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # every trainer starts from the same weights
    return torch.nn.Sequential(
        torch.nn.Linear(16, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 4),
    )


def batch(site: str, *seed: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch a trainer at ``site`` sees for ``seed`` (e.g. its rank and the step)."""
    rng = np.random.default_rng([zlib.crc32(site.encode()), *seed])
    x = rng.standard_normal((size, 16)).astype(np.float32)
    y = np.stack(
        [
            np.sin(x[:, 0] + x[:, 1]),
            x[:, 2] * x[:, 3],
            np.tanh(x[:, 4:8].sum(1)),
            np.cos(x[:, 8]) * x[:, 9],
        ],
        axis=1,
    ).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)
