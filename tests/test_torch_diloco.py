"""DiLoCo across three real sites: every site trains alone for H inner steps, then the outer
step through the gateway leaves every site with the same parameters, bit for bit."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import wangate.torch as wt
from wangate.loopback import LoopbackSites

pytestmark = pytest.mark.timeout(120)

H, OUTER_STEPS, OUTER_LR, MOMENTUM = 3, 3, 0.7, 0.9


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    small = "[compression]\nmin_lossy_bytes = 1024\n"  # so int8 applies to this small model
    directory = tmp_path_factory.mktemp("sites")
    lab = LoopbackSites(3, 1, directory=directory, extra_toml=small)
    try:
        lab.start(timeout_s=60)  # generous: CI machines may be busy
        yield lab
    finally:
        lab.stop()


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def train_site(
    lab: LoopbackSites,
    index: int,
    codec: str | None,
    out: dict[int, dict[str, list[np.ndarray]]],
    overlap: bool = False,
) -> None:
    torch.set_num_threads(1)
    site = lab.sites[index]
    record: dict[str, list[np.ndarray]] = {
        "start": [],
        "before": [],
        "after": [],
        "every": [],
        "anchor": [],
        "at_sync": [],
    }
    with site.client() as gw:
        model = build_model(index)  # sites start apart; the broadcast makes them equal
        wt.sync_parameters(model, gw, root="bj", tag=f"init.{codec}")
        record["start"].append(flat(model))
        inner = torch.optim.SGD(model.parameters(), lr=0.05)
        diloco = wt.DiLoCo(
            model,
            inner,
            gw,
            sync_every=H,
            outer_lr=OUTER_LR,
            momentum=MOMENTUM,
            codec=codec,
            tag=f"diloco.{codec}.{overlap}",
            overlap=overlap,
        )
        rng = np.random.default_rng(index)  # each site its own data
        for _ in range(H * OUTER_STEPS + overlap):
            x = torch.from_numpy(rng.standard_normal((32, 6)).astype(np.float32))
            y = torch.stack([x[:, 0] * x[:, 1], x[:, 2] - x[:, 3] * (index + 1)], dim=1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            inner.zero_grad()
            loss.backward()
            inner.step()
            before = flat(model)
            record["every"].append(before)
            if diloco.step():
                record["before"].append(before)
                record["after"].append(flat(model))
                record["anchor"].append(torch.cat([a.reshape(-1) for a in diloco.anchor]).numpy())
                record["at_sync"].append(record["every"][-2] if overlap else before)
    out[index] = record


def run(
    lab: LoopbackSites, codec: str | None, overlap: bool = False
) -> dict[int, dict[str, list[np.ndarray]]]:
    out: dict[int, dict[str, list[np.ndarray]]] = {}
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            train_site(lab, i, codec, out, overlap)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert sorted(out) == [0, 1, 2]
    return out


def test_outer_steps_leave_every_site_identical_and_follow_nesterov(sites: LoopbackSites) -> None:
    out = run(sites, None)
    assert [len(out[i]["after"]) for i in range(3)] == [OUTER_STEPS] * 3
    assert out[1]["start"][0].tobytes() == out[0]["start"][0].tobytes()
    for k in range(OUTER_STEPS):
        assert out[1]["after"][k].tobytes() == out[0]["after"][k].tobytes(), k
        assert out[2]["after"][k].tobytes() == out[0]["after"][k].tobytes(), k
        # the sites had drifted apart before the outer step
        assert out[1]["before"][k].tobytes() != out[0]["before"][k].tobytes()

    # The outer step by hand: Nesterov SGD on the mean pseudo-gradient.
    np.testing.assert_allclose(out[0]["after"], reference(out), rtol=0, atol=1e-5)
    assert out[0]["anchor"][-1].tobytes() == out[0]["after"][-1].tobytes()


def reference(out: dict[int, dict[str, list[np.ndarray]]]) -> list[np.ndarray]:
    anchor = out[0]["start"][0].astype(np.float64)
    velocity = np.zeros_like(anchor)
    result = []
    for k in range(OUTER_STEPS):
        pseudo = np.mean([anchor - out[i]["at_sync"][k] for i in range(3)], axis=0)
        velocity = MOMENTUM * velocity + pseudo
        anchor = anchor - OUTER_LR * (pseudo + MOMENTUM * velocity)
        result.append(anchor.copy())
    return result


def test_int8_pseudo_gradients_keep_sites_identical(sites: LoopbackSites) -> None:
    out = run(sites, "int8")
    for k in range(OUTER_STEPS):
        assert out[1]["after"][k].tobytes() == out[0]["after"][k].tobytes(), k
        assert out[2]["after"][k].tobytes() == out[0]["after"][k].tobytes(), k
    exact = reference(out)
    # int8 moved the result off the exact outer step, but only by quantisation error.
    assert not np.allclose(out[0]["after"][0], exact[0], rtol=0, atol=1e-7)
    np.testing.assert_allclose(out[0]["after"], exact, rtol=0, atol=2e-3)


def test_overlapped_outer_steps_keep_one_local_step(sites: LoopbackSites) -> None:
    """Streaming-style overlap: the exchange flies during the next inner step, which the
    outer step then keeps: model = outer parameters + (now - at the sync point)."""
    out = run(sites, None, overlap=True)
    assert [len(out[i]["anchor"]) for i in range(3)] == [OUTER_STEPS] * 3
    exact = reference(out)
    for k in range(OUTER_STEPS):
        for i in range(3):
            assert out[i]["anchor"][k].tobytes() == out[0]["anchor"][k].tobytes(), (i, k)
            local = out[i]["before"][k] - out[i]["at_sync"][k]  # the step taken in flight
            assert np.abs(local).max() > 0
            np.testing.assert_allclose(
                out[i]["after"][k], out[i]["anchor"][k] + local, rtol=0, atol=1e-6
            )
        np.testing.assert_allclose(out[0]["anchor"][k], exact[k], rtol=0, atol=1e-5)
