"""One site's side of a timed collective, run in that site's lab namespace.

    python -m bench.collectives.worker SPEC_JSON

SPEC: ``method`` (``gloo`` | ``alltoall`` | ``allreduce``), ``site``, ``sites`` (in
rank order), ``elements``, ``seed``, ``runs``, ``timeout_s``; for ``gloo``
``address`` (this site's lab address), ``master`` (``IP:PORT`` of rank 0's store);
otherwise ``socket`` (this site's gateway) and ``allreduce`` keyword arguments in
``options``. Optional: ``warmup_runs`` untimed collectives of ``warmup_elements`` before
the first run, then ``idle_s`` seconds with no traffic, ``run_offset`` (the first run's
index: its tensor).

Lines on stdout, one JSON object each: ``{"ready": run}`` when the tensor of that run
is ready (set-up and one small warm-up collective done), then, after the line ``go``
arrives on stdin, ``{"run", "start", "end", "exact", ...}`` with monotonic times.
Every site's tensor is seeded integers in [-1024, 1024] as float32, so any order of
summation gives exactly the same sum, which is checked bit for bit.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np

WARMUP_ELEMENTS = 1024
WARMUP_SEED = 1 << 20  # warm-up tensors' run index, apart from the timed runs'


def site_tensor(seed: int, site_index: int, run: int, elements: int) -> np.ndarray:
    rng = np.random.default_rng([seed, site_index, run])
    return rng.integers(-1024, 1025, size=elements, dtype=np.int32).astype(np.float32)


def expected_sum(seed: int, sites: int, run: int, elements: int) -> np.ndarray:
    total = np.zeros(elements, dtype=np.float32)
    for index in range(sites):
        total += site_tensor(seed, index, run, elements)
    return total


def share_slices(
    elements: int, sites: list[str], shares: dict[str, float], chunks: int
) -> dict[str, list[slice]]:
    """Each site's contiguous share of ``elements`` (in site order; the last site ends
    exactly at ``elements``), cut into ``chunks`` nearly equal slices."""
    pieces = {}
    start, acc = 0, 0.0
    for index, site in enumerate(sites):
        acc += shares[site]
        end = elements if index == len(sites) - 1 else round(acc * elements)
        cuts = [start + (end - start) * k // chunks for k in range(chunks + 1)]
        pieces[site] = [slice(a, b) for a, b in itertools.pairwise(cuts)]
        start = end
    return pieces


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class _Gloo:
    def __init__(self, spec: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        rank = spec["sites"].index(spec["site"])
        world = len(spec["sites"])
        timeout = timedelta(seconds=spec["timeout_s"])
        # init_method tcp:// on rank 0's lab address: the same store init_process_group uses.
        store, _, _ = next(
            dist.rendezvous(f"tcp://{spec['master']}", rank=rank, world_size=world, timeout=timeout)
        )
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # Bind this site's lab address (GLOO_SOCKET_IFNAME would pick lo's 127.0.0.1).
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=spec["address"])]
        self.group = dist.ProcessGroupGloo(store, rank, world, options)

    def allreduce(self, array: np.ndarray, step: int) -> np.ndarray:
        tensor = self.torch.from_numpy(array)
        self.group.allreduce([tensor]).wait()
        return array


class _AllToAll:
    """Every site sends its whole tensor to every other site and sums what arrives."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import wangate

        self.client = wangate.Client(spec["socket"])
        self.site = spec["site"]
        self.sites = spec["sites"]
        self.timeout_s = spec["timeout_s"]

    def allreduce(self, array: np.ndarray, step: int) -> np.ndarray:
        peers = [s for s in self.sites if s != self.site]
        for peer in peers:
            self.client.send(peer, "a2a", array, step=step)
        parts = {self.site: array}
        for peer in peers:
            parts[peer] = self.client.recv("a2a", source=peer, step=step, timeout=self.timeout_s)
        total = np.zeros_like(array)
        for site in self.sites:
            total += parts[site]
        return total


class _ReduceScatterAllGather:
    """Reduce-scatter then all-gather out of plain send/recv, with given shares
    (``options``: ``shares`` site -> fraction, ``chunks`` per share), pipelined: each
    reduced chunk is sent on as soon as it is complete. A reference for the share
    split independent of ``Client.allreduce``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import wangate

        self.client = wangate.Client(spec["socket"])
        self.site = spec["site"]
        self.sites = spec["sites"]
        self.timeout_s = spec["timeout_s"]
        self.shares = spec["options"]["shares"]
        self.chunks = spec["options"].get("chunks", 8)

    def allreduce(self, array: np.ndarray, step: int) -> np.ndarray:
        pieces = share_slices(array.size, self.sites, self.shares, self.chunks)
        peers = [s for s in self.sites if s != self.site]
        result = array.copy()
        for chunk in range(self.chunks):
            for peer in peers:
                part = array[pieces[peer][chunk]]
                self.client.send(peer, f"rs{chunk}", part, step=step)
        for chunk in range(self.chunks):
            mine = pieces[self.site][chunk]
            total = np.zeros(mine.stop - mine.start, dtype=array.dtype)
            for site in self.sites:  # site order: the same sum everywhere
                if site == self.site:
                    total += array[mine]
                else:
                    total += self.client.recv(
                        f"rs{chunk}", source=site, step=step, timeout=self.timeout_s
                    )
            result[mine] = total
            for peer in peers:
                self.client.send(peer, f"ag{chunk}", total, step=step)
        for chunk in range(self.chunks):
            for peer in peers:
                got = self.client.recv(f"ag{chunk}", source=peer, step=step, timeout=self.timeout_s)
                result[pieces[peer][chunk]] = got
        return result


class _Allreduce:
    def __init__(self, spec: dict[str, Any]) -> None:
        import wangate

        self.client = wangate.Client(spec["socket"])
        self.timeout_s = spec["timeout_s"]
        self.options = spec.get("options", {})
        self.site, self.sites = spec["site"], spec["sites"]

    def allreduce(self, array: np.ndarray, step: int) -> np.ndarray:
        result = self.client.allreduce(  # type: ignore[attr-defined]
            "bench", array, step=step, op="sum", timeout=self.timeout_s, **self.options
        )
        return np.asarray(getattr(result, "array", result))

    def diagnostics(self) -> dict[str, Any]:
        """The rates the leader holds for the measured plan (empty elsewhere), and the
        weights it derives from them."""
        from wangate.collective.capacity import Reports
        from wangate.collective.plan import Plan

        rates = self.client._session.collective.rates_mbps
        if not rates:
            return {"rates_mbps": rates}
        plan = Plan.equal(self.sites)
        weights = Reports(self.site, plan, "bench").plan_from_rates(rates)
        return {"rates_mbps": rates, "weights": dict(zip(plan.sites, weights.weights, strict=True))}


METHODS = {
    "gloo": _Gloo,
    "alltoall": _AllToAll,
    "rsag": _ReduceScatterAllGather,
    "allreduce": _Allreduce,
}


def main(spec: dict[str, Any]) -> None:
    method = METHODS[spec["method"]](spec)
    index = spec["sites"].index(spec["site"])
    elements = spec["elements"]
    seed = spec["seed"]
    # Warm-up (connections, first-use costs) as step 0, then ``warmup_runs`` untimed
    # collectives of ``warmup_elements`` (the measured plan's inputs); run k follows.
    method.allreduce(np.ones(WARMUP_ELEMENTS, dtype=np.float32), 0)
    warmups = spec.get("warmup_runs", 0)
    for w in range(warmups):
        size = spec.get("warmup_elements", elements)
        method.allreduce(site_tensor(seed, index, WARMUP_SEED + w, size), 1 + w)
    if spec.get("idle_s", 0.0) > 0:
        time.sleep(spec["idle_s"])  # a trainer computing between calls: the paths idle
    first = spec.get("run_offset", 0)
    for run in range(first, first + spec["runs"]):
        array = site_tensor(seed, index, run, elements)
        expected = expected_sum(seed, len(spec["sites"]), run, elements)
        _emit({"ready": run})
        if sys.stdin.readline().strip() != "go":
            return
        start = time.monotonic()
        result = method.allreduce(array, warmups + run + 1)
        end = time.monotonic()
        exact = result.dtype == np.float32 and bool(np.array_equal(result, expected))
        max_err = float(np.max(np.abs(result.astype(np.float64) - expected))) if not exact else 0.0
        line = {"run": run, "start": start, "end": end, "exact": exact, "max_abs_err": max_err}
        diagnostics = getattr(method, "diagnostics", None)
        if diagnostics is not None:
            line.update(diagnostics())
        _emit(line)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
