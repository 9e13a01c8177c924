"""Collectives on real daemons: five loopback sites, real QUIC and Unix sockets.

One lab serves every test; calls over 2, 3 or 4 sites name them with ``sites=``. Its
bound says no direct exchange (delay 0), so every call over three or more sites runs
reduce-scatter/all-gather, in 4 KiB chunks. Shares follow measured capacity, or the
weights a test gives its clients' settings.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

import wangate
from wangate.collective import Plan
from wangate.loopback import LoopbackSites

pytestmark = pytest.mark.timeout(240)

NAMES = ("bj", "sh", "gz", "sz", "hz")
CONFIG = "[collective]\nchunk_bytes = 4096\ndelay_ms = 0\n"
WEIGHTS = {"bj": 2.0, "sh": 1.0, "gz": 1.0, "sz": 1.5, "hz": 0.5}
SLOW_S = 60.0  # generous: the machine is shared; a failing call must not hang the test


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    directory = tmp_path_factory.mktemp("collective")
    sites = LoopbackSites(5, 1, directory=directory, mtu=9000, extra_toml=CONFIG)
    try:
        sites.start(timeout_s=120)  # 20 QUIC handshakes; the machine may be busy
        yield sites
    finally:
        sites.stop()


def weighted(gw: wangate.Client, weights: Mapping[str, float]) -> wangate.Client:
    """The client as a gateway with ``[collective] weights`` would configure it (the
    hello reply's settings; config -> settings is tested in test_collective_plan)."""
    gw.settings["collective"]["weights"] = dict(weights)
    return gw


def on_sites(
    lab: LoopbackSites, sites: Sequence[str], call: Callable[[wangate.Client, str], Any]
) -> dict[str, Any]:
    """Run ``call(client, site)`` on every site at once; results or exceptions by site."""
    results: dict[str, Any] = {}

    def worker(site: str) -> None:
        try:
            with lab[site].client() as gw:
                results[site] = call(gw, site)
        except BaseException as exc:
            results[site] = exc

    threads = [threading.Thread(target=worker, args=(s,)) for s in sites]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SLOW_S * 3)
    assert not any(t.is_alive() for t in threads), "a collective call hung"
    return results


def data(site: str, shape: tuple[int, ...], dtype: str, step: int) -> np.ndarray:
    rng = np.random.default_rng([ord(c) for c in site] + [step, *shape])
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-50_000, 50_000, size=shape).astype(dtype)


def expected(inputs: Mapping[str, np.ndarray], op: str) -> np.ndarray:
    """The documented order: sorted site names; float16 accumulated in float32."""
    dtype = next(iter(inputs.values())).dtype
    acc_dtype = np.dtype(np.float32) if dtype == np.float16 else dtype
    acc = np.zeros(next(iter(inputs.values())).shape, acc_dtype)
    first = True
    for site in sorted(inputs):
        value = inputs[site].astype(acc_dtype)
        acc = value.copy() if first else acc + value
        first = False
    if op == "mean":
        acc = acc / acc_dtype.type(len(inputs))
    return acc.astype(dtype)


def raise_any(results: Mapping[str, Any]) -> None:
    for value in results.values():
        if isinstance(value, BaseException):
            raise value


CASES = [  # sites, shape, dtype, op, configured weights (else measured capacity)
    (2, (1000,), "float32", "sum", False),
    (2, (7, 3), "float64", "mean", True),
    (3, (5000,), "float32", "mean", True),
    (3, (), "int32", "sum", False),
    (3, (33, 65), "float16", "sum", True),
    (4, (2, 3, 401), "int64", "sum", True),
    (4, (3000,), "uint16", "sum", False),
    (4, (4097,), "float64", "mean", False),
    (5, (9999,), "float32", "sum", True),
    (5, (20_000,), "float16", "mean", False),
    (5, (3,), "int8", "sum", False),
    (5, (0,), "float32", "mean", True),
]


@pytest.mark.parametrize(("n_sites", "shape", "dtype", "op", "weights"), CASES)
def test_allreduce_is_exact_and_identical_on_every_site(
    lab: LoopbackSites, n_sites: int, shape: tuple[int, ...], dtype: str, op: str, weights: bool
) -> None:
    sites = NAMES[:n_sites]
    step = len(shape) * 1000 + n_sites
    inputs = {s: data(s, shape, dtype, step) for s in sites}
    tag = f"t-{n_sites}-{dtype}-{len(shape)}"
    chosen = None if n_sites == 5 else list(sites)  # all five: the gateway's own list

    def call(gw: wangate.Client, site: str) -> np.ndarray:
        if weights:
            weighted(gw, WEIGHTS)
        return gw.allreduce(tag, inputs[site], step=step, op=op, sites=chosen, timeout=SLOW_S)

    results = on_sites(lab, sites, call)
    raise_any(results)
    want = expected(inputs, op)
    for site in sites:
        got = results[site]
        assert got.shape == shape and got.dtype == np.dtype(dtype)
        assert got.tobytes() == want.tobytes(), site


def test_async_client_interleaves_tags_and_steps(lab: LoopbackSites) -> None:
    """Every site runs six allreduces at once (two tags, three steps, started in a
    different order on each site) on one AsyncClient connection."""
    sites = NAMES[:3]
    keys = [(tag, step) for tag in ("wa", "wb") for step in (1, 2, 3)]

    async def main(site: str) -> dict[tuple[str, int], np.ndarray]:
        order = keys if site != "sh" else keys[::-1]
        async with wangate.AsyncClient(lab[site].socket_path) as gw:
            got = await asyncio.gather(
                *(
                    gw.allreduce(
                        t, data(site, (3000,), "float32", s), step=s, sites=sites, timeout=SLOW_S
                    )
                    for t, s in order
                )
            )
        return dict(zip(order, got, strict=True))

    results = on_sites(lab, sites, lambda gw, s: asyncio.run(main(s)))
    raise_any(results)
    for tag, step in keys:
        want = expected({s: data(s, (3000,), "float32", step) for s in sites}, "sum")
        for site in sites:
            assert results[site][(tag, step)].tobytes() == want.tobytes(), (site, tag, step)


def test_weighted_lossy_allreduce_is_identical_everywhere(lab: LoopbackSites) -> None:
    sites = NAMES[:3]
    inputs = {s: data(s, (20_000,), "float32", 7) for s in sites}
    results = on_sites(
        lab,
        sites,
        lambda gw, s: weighted(gw, WEIGHTS).allreduce(
            "lossy", inputs[s], step=7, op="mean", codec="int8", sites=sites, timeout=SLOW_S
        ),
    )
    raise_any(results)
    first = results["bj"]
    assert all(results[s].tobytes() == first.tobytes() for s in sites)
    exact = expected(inputs, "mean")
    assert 0 < np.max(np.abs(first - exact)) < 0.05


def test_broadcast_and_barrier(lab: LoopbackSites) -> None:
    sites = NAMES[:4]
    params = data("gz", (100, 77), "float32", 0)

    def call(gw: wangate.Client, site: str) -> np.ndarray:
        gw.barrier("start", step=0, sites=sites, timeout=SLOW_S)
        got = gw.broadcast(
            "params", params if site == "gz" else None, root="gz", sites=sites, timeout=SLOW_S
        )
        gw.barrier("start", step=1, sites=sites, timeout=SLOW_S)
        return got

    results = on_sites(lab, sites, call)
    raise_any(results)
    for site in sites:
        assert results[site].tobytes() == params.tobytes()
        assert results[site].shape == (100, 77)


def test_a_missing_site_is_named_within_the_timeout(lab: LoopbackSites) -> None:
    sites = ["bj", "sh", "sz"]  # sz never calls
    results = on_sites(
        lab,
        ["bj", "sh"],
        lambda gw, s: gw.allreduce(
            "lonely", np.ones(5000, np.float32), step=3, sites=sites, timeout=3
        ),
    )
    for site in ("bj", "sh"):
        error = results[site]
        assert isinstance(error, wangate.CollectiveTimeout), error
        assert error.missing == ("sz",)
        assert "nothing arrived from sz" in str(error) and "timed out after 3 s" in str(error)
        assert f"allreduce 'lonely' step 3 at {site}" in str(error)
    barrier = on_sites(lab, ["gz"], lambda gw, s: gw.barrier("b", step=9, timeout=2))["gz"]
    assert isinstance(barrier, wangate.CollectiveTimeout)
    assert barrier.missing == ("bj", "hz", "sh", "sz")


def test_partial_agrees_on_contributors_and_a_site_rejoins(lab: LoopbackSites) -> None:
    sites = ["bj", "sh", "gz", "sz"]
    present = ["bj", "gz", "sh"]  # sz misses step 10
    inputs = {s: data(s, (6000,), "float32", 10) for s in sites}
    results = on_sites(
        lab,
        present,
        lambda gw, s: gw.allreduce(
            "part", inputs[s], step=10, op="mean", sites=sites, partial=True, timeout=10
        ),
    )
    raise_any(results)
    want = expected({s: inputs[s] for s in present}, "mean")
    for site in present:
        assert results[site].contributors == ("bj", "gz", "sh")
        assert results[site].array.tobytes() == want.tobytes()
    # step 11: sz is back and contributes again
    inputs = {s: data(s, (6000,), "float32", 11) for s in sites}
    results = on_sites(
        lab,
        sites,
        lambda gw, s: gw.allreduce(
            "part", inputs[s], step=11, op="mean", sites=sites, partial=True, timeout=SLOW_S
        ),
    )
    raise_any(results)
    want = expected(inputs, "mean")
    for site in sites:
        assert results[site].contributors == ("bj", "gz", "sh", "sz")
        assert results[site].array.tobytes() == want.tobytes()


def test_partial_alone_is_an_error_not_a_result(lab: LoopbackSites) -> None:
    got = on_sites(
        lab,
        ["hz"],
        lambda gw, s: gw.allreduce(
            "alone", np.ones(3), step=1, sites=["hz", "bj"], partial=True, timeout=1
        ),
    )["hz"]
    assert isinstance(got, wangate.CollectiveTimeout) and got.missing == ("bj",)


def test_bad_calls_are_refused_clearly(lab: LoopbackSites) -> None:
    with lab["bj"].client() as gw:
        with pytest.raises(wangate.LocalProtocolError, match="reserved for collectives"):
            gw.send("sh", "@c/rs/x/0/y", np.ones(3))
        with pytest.raises(wangate.LocalProtocolError, match="not peers of this gateway"):
            gw.allreduce("x", np.ones(3), sites=["bj", "nowhere"])
        with pytest.raises(wangate.LocalProtocolError, match="must include this site"):
            gw.allreduce("x", np.ones(3), sites=["sh", "gz"])
        with pytest.raises(wangate.LocalProtocolError, match="step must be"):
            gw.allreduce("x", np.ones(3), step=-1)
        with pytest.raises(wangate.LocalProtocolError, match="op 'mean' needs a float"):
            gw.allreduce("x", np.ones(3, np.int32), op="mean")
        with pytest.raises(wangate.LocalProtocolError, match="root 'xx' is not among"):
            gw.broadcast("x", np.ones(3), root="xx")
        gw.ping()  # the connection is still good
    assert Plan.equal(NAMES).sites == tuple(sorted(NAMES))


def test_shares_by_measured_capacity_are_announced_and_exact(lab: LoopbackSites) -> None:
    """No weights configured: the leader (bj) announces shares from the rates the
    gateways measure, each call; the others report their capacity to it."""
    sites = ("bj", "gz", "sh")
    capacities: dict[str, dict[str, float]] = {}

    def call(gw: wangate.Client, site: str) -> list[np.ndarray]:
        got = []
        for step in range(4):
            array = data(site, (50_000,), "float32", step)
            got.append(
                gw.allreduce("cap", array, step=step, op="mean", sites=sites, timeout=SLOW_S)
            )
        capacities[site] = dict(gw._session.collective.rates_mbps)
        return got

    results = on_sites(lab, sites, call)
    raise_any(results)
    for step in range(4):
        want = expected({s: data(s, (50_000,), "float32", step) for s in sites}, "mean")
        for site in sites:
            assert results[site][step].tobytes() == want.tobytes(), (site, step)
    # the leader heard the others' capacities (measured by their gateways while sending)
    assert set(capacities["bj"]) == {"bj", "gz", "sh"}
    for site, rates in capacities["bj"].items():  # each site's rate to each other site
        assert set(rates) == set(sites) - {site} and all(r > 0 for r in rates.values()), site
    assert capacities["gz"] == capacities["sh"] == {}  # only the leader keeps them


def test_async_partial_broadcast_and_barrier(lab: LoopbackSites) -> None:
    """The asyncio client through the same scripts: a partial allreduce with hz absent,
    then a broadcast from sz and a barrier among the four present."""
    sites = ["bj", "gz", "hz", "sh", "sz"]
    present = ["bj", "gz", "sh", "sz"]
    inputs = {s: data(s, (4000,), "float64", 21) for s in sites}
    params = data("sz", (10, 10), "int32", 21)

    async def main(site: str) -> tuple[Any, np.ndarray]:
        async with wangate.AsyncClient(lab[site].socket_path) as gw:
            res = await gw.allreduce(
                "apart", inputs[site], step=21, op="mean", partial=True, timeout=12
            )
            got = await gw.broadcast(
                "ap", params if site == "sz" else None, root="sz", sites=present, timeout=SLOW_S
            )
            await gw.barrier("ab", step=21, sites=present, timeout=SLOW_S)
        return res, got

    results = on_sites(lab, present, lambda gw, s: asyncio.run(main(s)))
    raise_any(results)
    want = expected({s: inputs[s] for s in present}, "mean")
    for site in present:
        res, got = results[site]
        assert res.contributors == tuple(present)
        assert res.array.tobytes() == want.tobytes()
        assert got.tobytes() == params.tobytes() and got.shape == (10, 10)


def test_chunks_gathered_through_relays_are_exact_on_both_clients(
    lab: LoopbackSites, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's plan with all-gather routes (loopback links are all alike, so the
    linear program finds none: the leader is given these): some chunks reach a site
    through a third one, on the blocking and on the asyncio client."""
    from wangate.collective import capacity
    from wangate.collective.plan import Route

    sites = ("bj", "gz", "sh", "sz")
    # sorted: bj, gz, sh, sz. sz gets bj's part through gz; bj gets gz's through sh;
    # sh's part goes straight to all; sz's part reaches gz through bj
    routes = (
        Route("bj", ("bj", "bj", "bj", "gz"), 1.0),
        Route("gz", ("sh", "gz", "gz", "gz"), 0.5),
        Route("sh", ("sh", "sh", "sh", "sh"), 1.0),
        Route("sz", ("sz", "bj", "sz", "sz"), 0.7),
    )
    planned: list[int] = []

    def given(plan_sites: Sequence[str], links: Mapping[tuple[str, str], float]) -> Any:
        planned.append(len(plan_sites))
        return routes if tuple(plan_sites) == sites else ()

    monkeypatch.setattr(capacity, "gather_routes", given)

    def blocking(gw: wangate.Client, site: str) -> list[np.ndarray]:
        return [
            gw.allreduce("relay", data(site, (20_000,), "float32", step), step=step,
                         sites=sites, timeout=SLOW_S)
            for step in range(4)
        ]  # fmt: skip

    async def asynchronous(site: str) -> list[np.ndarray]:
        async with wangate.AsyncClient(lab[site].socket_path) as gw:
            return [
                await gw.allreduce("arelay", data(site, (20_000,), "float32", step),
                                   step=step, sites=sites, timeout=SLOW_S)
                for step in range(4, 8)
            ]  # fmt: skip

    for steps, call in (
        (range(4), blocking),
        (range(4, 8), lambda gw, s: asyncio.run(asynchronous(s))),
    ):
        before = len(planned)
        results = on_sites(lab, sites, call)
        raise_any(results)
        for k, step in enumerate(steps):
            want = expected({s: data(s, (20_000,), "float32", step) for s in sites}, "sum")
            for site in sites:
                assert results[site][k].tobytes() == want.tobytes(), (site, step)
        # the leader planned over the links (every link measured) for at least one call
        assert len(planned) > before
