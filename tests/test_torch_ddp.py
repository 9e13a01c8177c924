"""A real DDP run across three sites of two processes each: Gloo inside each site on
127.0.0.1, the gateway's allreduce between the sites (real daemons, QUIC, Unix sockets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.torch_ddp_worker import batch, build_model, flat_params
from wangate.loopback import SITE_NAMES, LoopbackSites, SiteProcess

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # ~40 s on an idle 2-core machine

SITES, RANKS, STEPS = 3, 2, 5
ROOT = "bj"
REPO = Path(__file__).resolve().parent.parent


def reference_run(data_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The same model trained in one process on the union of every rank's batches."""
    torch.set_num_threads(1)
    model = build_model(100)  # the root site's rank 0, which sync_parameters spreads
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history, losses = [flat_params(model)], []
    for step in range(STEPS):
        parts = [batch(step + data_offset, s, r) for s in range(SITES) for r in range(RANKS)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        history.append(flat_params(model))
    return np.stack(history), np.array(losses)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    sites = LoopbackSites(
        SITES, 1, directory=tmp_path_factory.mktemp("sites"), extra_toml="[jobs.a]\n[jobs.b]\n"
    )
    try:
        sites.start(timeout_s=60)  # generous: CI machines may be busy
        yield sites
    finally:
        sites.stop()


@dataclass
class Rank:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


def run_site_ranks(sites: list[SiteProcess], out: Path, **extra: object) -> list[Rank]:
    """Start every site's ranks. Each site meets in a file of its own (no TCP port to
    race for), and each rank writes its output to a file (no pipe to fill)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    ranks = []
    for site in sites:
        init = f"file://{out / f'{site.name}.rendezvous'}"
        for rank in range(RANKS):
            args = {
                "site_index": SITE_NAMES.index(site.name),
                "rank": rank,
                "ranks": RANKS,
                "init": init,
                "socket": str(site.socket_path),
                "root": ROOT,
                "steps": STEPS,
                "out": str(out),
                **extra,
            }
            log_path = out / f"{site.name}-{rank}.log"
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    [sys.executable, "-m", "tests.torch_ddp_worker", json.dumps(args)],
                    cwd=REPO,
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            ranks.append(Rank(f"{site.name} rank {rank}", process, log_path))
    return ranks


def finish(ranks: list[Rank], timeout_s: float = 400.0) -> None:
    """Every rank exits 0 within ``timeout_s``; else all are killed and the failure shows
    each rank's exit status and output."""
    deadline = time.monotonic() + timeout_s
    for rank in ranks:
        try:
            rank.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    for rank in ranks:
        if rank.process.poll() is None:
            rank.process.kill()
            rank.process.wait()
    report = "\n".join(
        f"--- {r.name}: exit {r.process.returncode}\n"
        + r.log_path.read_text(errors="replace")[-4000:]
        for r in ranks
    )
    assert [r.process.returncode for r in ranks] == [0] * len(ranks), report


def test_ddp_hook_three_sites_two_ranks_each(lab: LoopbackSites, tmp_path: Path) -> None:
    out = tmp_path
    finish(run_site_ranks(lab.sites, out))

    runs = {(s, r): np.load(out / f"{s}-{r}.npz") for s in range(SITES) for r in range(RANKS)}
    first = runs[(0, 0)]["params"]
    assert first.shape == (STEPS + 1, first.shape[1])
    for key, run in runs.items():  # bit for bit on all six, after the broadcast and every step
        assert run["params"].tobytes() == first.tobytes(), key
    # The parameters moved: the steps did something.
    assert not np.array_equal(first[0], first[-1])

    ref_params, ref_losses = reference_run()
    assert first[0].tobytes() == ref_params[0].tobytes()  # root site's initial model, exactly
    np.testing.assert_allclose(first, ref_params, rtol=0, atol=2e-6)
    losses = np.mean([run["losses"] for run in runs.values()], axis=0)
    print(  # the exactness figures, for the record (pytest -s)
        f"max |param - single process| {np.abs(first - ref_params).max():.3g}, "
        f"max loss rel. diff {np.abs(losses / ref_losses - 1).max():.3g}"
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert ref_losses[-1] < ref_losses[0]

    for s in range(SITES):
        for r in range(RANKS):
            log = json.loads((out / f"{s}-{r}.critical.json").read_text())
            steps = sorted({entry[0] for entry in log})
            assert steps == list(range(STEPS))
            for step in steps:
                entries = [e for e in log if e[0] == step]
                # DDP uses one bucket for the first iteration, then rebuilds them in the
                # order backward produced gradients: several, so the choice means something.
                assert len(entries) >= (2 if step else 1)
                # exactly one critical bucket per step: the one with the first layer
                assert [e[2] for e in entries] == [e[3] for e in entries]
                assert sum(e[2] for e in entries) == 1


def test_a_site_alone_fails_on_every_rank_within_the_timeout(
    lab: LoopbackSites, tmp_path: Path
) -> None:
    """gz's two ranks step while no other site does: backward raises on both, naming the
    missing sites, within the timeout (plus start-up slack), and nothing hangs."""
    timeout_s = 2.0
    finish(run_site_ranks([lab["gz"]], tmp_path, alone=True, timeout_s=timeout_s))
    for rank in range(RANKS):
        outcome = json.loads((tmp_path / f"alone-{rank}.json").read_text())
        assert outcome["error"] is not None, rank
        assert "CrossSiteError: 'alone.b0' step 0" in outcome["error"]
        assert outcome["seconds"] < timeout_s + 5
    leader = json.loads((tmp_path / "alone-0.json").read_text())["error"]
    assert "bj" in leader and "sh" in leader  # the sites that never answered


def test_two_jobs_train_with_the_same_hook_tags_at_once_and_never_mix(
    lab: LoopbackSites, tmp_path: Path
) -> None:
    """Two DDP runs at once, in jobs ``a`` and ``b``: the same bucket tags (``ddp.b0``,
    ...) and steps, different data. Each matches its own single-process reference, so
    neither averaged in the other's gradients."""
    outs = {job: tmp_path / job for job in ("a", "b")}
    offsets = {"a": 0, "b": 1000}
    procs = []
    for job, out in outs.items():
        out.mkdir()
        procs += run_site_ranks(lab.sites, out, job=job, data_offset=offsets[job])
    finish(procs)
    for job, out in outs.items():
        ref_params, _ = reference_run(offsets[job])
        for s in range(SITES):
            for r in range(RANKS):
                params = np.load(out / f"{s}-{r}.npz")["params"]
                np.testing.assert_allclose(params, ref_params, rtol=0, atol=2e-6)
    a_final = np.load(outs["a"] / "0-0.npz")["params"][-1]
    b_final = np.load(outs["b"] / "0-0.npz")["params"][-1]
    assert np.abs(a_final - b_final).max() > 1e-3  # the two runs did differ
