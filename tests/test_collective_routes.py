"""Sans-IO tests of shares and routes from link rates: the linear program, the weights it
gives over a mesh of links, all-gather routes through relays, the plan and its
announcement with routes, and allreduce runs that pass chunks on (exact results, who
sends what to whom, no deadlock for a driver that waits in order)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

import numpy as np
import pytest

from wangate.codec import decode_tensor
from wangate.collective import AllreduceRun, CollectiveMismatch, Outgoing, Plan
from wangate.collective.capacity import Reports, capacities_mbps, links_mbps
from wangate.collective.lp import maximise_sum
from wangate.collective.plan import Route, capacity_weights, chunks
from wangate.collective.routes import MIN_GAIN, gather_routes, mesh_weights
from wangate.errors import LocalProtocolError

# coll_4_quarter's links (Mbit/s), the lab where the slowest link joins two busy sites
FOUR = ("bj", "gz", "sg", "sh")
FOUR_LINKS = {
    ("bj", "sh"): 12.5,
    ("bj", "gz"): 7.5,
    ("gz", "sh"): 5.0,
    ("bj", "sg"): 6.25,
    ("sg", "sh"): 10.0,
    ("gz", "sg"): 7.5,
}
MBIT_8MIB = 8 * 2**20 * 8 / 1e6  # an 8 MiB tensor in Mbit


def both_ways(links: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {**links, **{(b, a): r for (a, b), r in links.items()}}


def call_seconds(plan: Plan, links: Mapping[tuple[str, str], float], mbit: float) -> float:
    """The busiest link direction's time for a tensor of ``mbit`` under ``plan``: each
    site's contribution to each owner, and each reduced part along its route."""
    load: dict[tuple[str, str], float] = {}
    parts = plan.routes or tuple(
        Route(s, tuple(s for _ in plan.sites), w)
        for s, w in zip(plan.sites, plan.weights, strict=True)
    )
    total = sum(r.weight for r in parts)
    for r in parts:
        share = r.weight / total
        for site, via in zip(plan.sites, r.via, strict=True):
            if site != r.owner:
                load[(site, r.owner)] = load.get((site, r.owner), 0.0) + share
                load[(via, site)] = load.get((via, site), 0.0) + share
    rates = both_ways(links)
    return max(mbit * share / rates[key] for key, share in load.items())


# -- the linear program ---------------------------------------------------------------


def test_maximise_sum_finds_the_vertex() -> None:
    # x + y <= 4, x <= 3, y <= 2: optimum 4 at (2, 2) or (3, 1); Bland's rule picks (3, 1)
    assert maximise_sum([[1, 1], [1, 0], [0, 1]], [4, 3, 2]) == [3.0, 1.0]
    # a triangle of equal links: every site half
    assert maximise_sum([[1, 1, 0], [1, 0, 1], [0, 1, 1]], [1, 1, 1]) == [0.5, 0.5, 0.5]
    # a zero limit pins both of its variables (degenerate, no cycling)
    assert maximise_sum([[1, 1, 0], [0, 1, 1], [1, 0, 1]], [0, 5, 5]) == [0.0, 0.0, 5.0]
    x = maximise_sum([[1.0 if s in pair else 0.0 for s in FOUR] for pair in FOUR_LINKS],
                     list(FOUR_LINKS.values()))  # fmt: skip
    assert x == pytest.approx([3.125, 4.375, 3.125, 0.625], abs=1e-12)


def test_maximise_sum_rejects_bad_input() -> None:
    with pytest.raises(LocalProtocolError, match="limits must be finite and >= 0"):
        maximise_sum([[1.0]], [-1.0])
    with pytest.raises(LocalProtocolError, match="limits must be finite and >= 0"):
        maximise_sum([[1.0]], [float("inf")])
    with pytest.raises(LocalProtocolError, match="ragged"):
        maximise_sum([[1.0, 1.0], [1.0]], [1.0, 1.0])
    with pytest.raises(LocalProtocolError, match="unbounded"):
        maximise_sum([[1.0, 0.0]], [1.0])


# -- shares over a mesh of links ------------------------------------------------------


def test_mesh_weights_load_the_busiest_link_least() -> None:
    weights = mesh_weights(FOUR, FOUR_LINKS)
    assert weights == {"bj": 0.7143, "gz": 1.0, "sg": 0.7143, "sh": 0.1429}
    mesh = Plan.weighted(FOUR, weights)
    by_site = Plan.weighted(
        FOUR, capacity_weights({"bj": 26.25, "gz": 20.0, "sg": 23.75, "sh": 27.5})
    )
    # 8 MiB: 5.97 s at these shares against 6.19 s at the sites' water-filling shares
    assert call_seconds(mesh, FOUR_LINKS, MBIT_8MIB) == pytest.approx(5.965, abs=1e-3)
    assert call_seconds(by_site, FOUR_LINKS, MBIT_8MIB) == pytest.approx(6.194, abs=1e-3)
    # three sites: the same weights as water-filling the sites' capacities
    three = {("bj", "sh"): 12.5, ("bj", "gz"): 7.5, ("gz", "sh"): 5.0}
    assert mesh_weights(["bj", "gz", "sh"], three) == {"bj": 1.0, "gz": 0.05, "sh": 0.6667}
    assert capacity_weights({"bj": 20.0, "gz": 12.5, "sh": 17.5}) == {
        "bj": 1.0, "gz": 0.05, "sh": 0.6667,
    }  # fmt: skip
    # the slower direction counts; a pair with no rate carries nothing
    slow_b = {("a", "b"): 10.0, ("b", "a"): 2.0, ("b", "c"): 2.0, ("a", "c"): 10.0}
    assert mesh_weights(["a", "b", "c"], slow_b) == {"a": 1.0, "b": 0.05, "c": 1.0}
    assert mesh_weights(["a", "b", "c"], {}) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert mesh_weights(["a", "b"], {("a", "b"): 1.0}) == {"a": 1.0, "b": 1.0}


# -- routes ---------------------------------------------------------------------------


def test_gather_routes_beat_direct_sends_where_a_slow_link_joins_busy_sites() -> None:
    routes = gather_routes(FOUR, FOUR_LINKS)
    assert routes
    plan = Plan.equal(FOUR, routes=routes)  # validates every route
    # 8 MiB in 4.19 s (the sites' own bound at the best shares: 4.13 s), against 5.97 s
    # for the best shares sent direct
    assert call_seconds(plan, FOUR_LINKS, MBIT_8MIB) == pytest.approx(4.194, abs=1e-3)
    relays = {
        (r.owner, s, v)
        for r in routes
        for s, v in zip(FOUR, r.via, strict=True)
        if v not in (s, r.owner)
    }
    assert relays  # some chunks do go through a third site
    # the same input gives the same routes (every leader announces the same)
    assert gather_routes(list(reversed(FOUR)), dict(reversed(list(FOUR_LINKS.items())))) == routes


def test_gather_routes_only_when_they_gain() -> None:
    three = {("bj", "sh"): 12.5, ("bj", "gz"): 7.5, ("gz", "sh"): 5.0}
    assert gather_routes(["bj", "gz", "sh"], three) == ()  # nothing to gain on 3 sites here
    equal = {pair: 100.0 for pair in itertools.combinations("abcd", 2)}
    assert gather_routes(list("abcd"), equal) == ()
    assert gather_routes(["a", "b"], {("a", "b"): 1.0}) == ()
    six = {pair: 10.0 for pair in itertools.combinations("abcdef", 2)}
    six[("a", "b")] = 1.0
    assert gather_routes(list("abcdef"), six) == ()  # more than MAX_SITES: direct
    five = {pair: 10.0 for pair in itertools.combinations("abcde", 2)}
    five[("a", "b")] = 1.0
    routes = gather_routes(list("abcde"), five)
    gain = call_seconds(Plan.weighted("abcde", mesh_weights("abcde", five)), five, 1.0)
    assert call_seconds(Plan.equal("abcde", routes=routes), five, 1.0) * MIN_GAIN <= gain


def test_plan_checks_its_routes() -> None:
    sites = ("a", "b", "c")
    good = Route("a", ("a", "a", "b"), 1.0)  # c gets a's chunks through b
    assert Plan.equal(sites, routes=(good,)).routes == (good,)
    bad = [
        (Route("x", ("a", "a", "a"), 1.0), "does not fit"),
        (Route("a", ("a", "a"), 1.0), "does not fit"),
        (Route("a", ("a", "a", "a"), 0.0), "must be > 0"),
        (Route("a", ("b", "a", "a"), 1.0), "'a' cannot get its chunks from 'b'"),
        (Route("a", ("a", "b", "b"), 1.0), "'b' cannot get its chunks from 'b'"),
        (Route("a", ("a", "c", "b"), 1.0), "'b' cannot get its chunks from 'c'"),
        (Route("a", ("a", "a", "x"), 1.0), "'c' cannot get its chunks from 'x'"),
    ]
    for route, message in bad:
        with pytest.raises(LocalProtocolError, match=message):
            Plan.equal(sites, routes=(route,))


def test_plan_parts_digest_and_chunks_with_routes() -> None:
    sites = ("a", "b", "c")
    routes = (Route("b", ("b", "b", "a"), 1.0), Route("a", ("a", "a", "a"), 3.0))
    plan = Plan.equal(sites, routes=routes, chunk_bytes=4096)
    parts = plan.parts(8)
    assert [(s.owner, s.start, s.stop, r) for s, r in parts] == [
        ("b", 0, 2, routes[0]),
        ("a", 2, 8, routes[1]),
    ]
    assert [r for _, r in Plan.equal(sites).parts(3)] == [None, None, None]
    assert plan.digest != Plan.equal(sites, chunk_bytes=4096).digest
    assert plan.cut_bytes == 1024 and Plan.equal(sites, chunk_bytes=4096).cut_bytes == 4096
    assert plan.restricted(["a", "b"]).routes == ()
    assert routes[0].children("b", sites) == ("a",) and routes[0].children("a", sites) == ("c",)


# -- runs that pass chunks on ---------------------------------------------------------


def run_all(
    plan: Plan, inputs: Mapping[str, np.ndarray], spec: str = "none", strict: bool = False
) -> tuple[dict[str, AllreduceRun], Counter[tuple[str, str, str]]]:
    """Every site's run, messages moved through an in-memory router (decoded by the real
    codec). ``strict``: a site takes only its first wanted message and those it passes
    on, as the blocking driver does. Counts (kind, from, to)."""
    runs = {
        s: AllreduceRun(site=s, plan=plan, tag="g", array=a, spec=spec) for s, a in inputs.items()
    }
    inbox: dict[tuple[str, str, str], np.ndarray] = {}
    sent: Counter[tuple[str, str, str]] = Counter()

    def post(site: str, messages: list[Outgoing]) -> None:
        for out in messages:
            for peer in out.peers:
                inbox[(peer, out.tag, site)] = decode_tensor(out.meta, bytes(out.payload))
                sent[(out.tag.split("/")[1], site, peer)] += 1

    for site in sorted(runs):
        post(site, runs[site].start())
    while not all(r.done for r in runs.values()):
        progressed = False
        for site, run in sorted(runs.items()):
            wants = run.wanted()[:1] + run.relayed() if strict else run.wanted()
            for want in wants:
                array = inbox.pop((site, want.tag, want.source), None)
                if array is not None:
                    post(site, run.receive(want.source, want.tag, array))
                    progressed = True
        assert progressed, "deadlock"
    assert not inbox
    return runs, sent


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_allreduce_through_relays_is_exact_everywhere(strict: bool, dtype: str) -> None:
    plan = Plan.equal(FOUR, rate_bps=1.0, chunk_bytes=4096, routes=gather_routes(FOUR, FOUR_LINKS))
    rng = np.random.default_rng(7)
    inputs = {s: (rng.standard_normal(20_000) * 100).astype(dtype) for s in FOUR}
    runs, sent = run_all(plan, inputs, strict=strict)
    acc = np.float32 if dtype == "float16" else dtype
    expected = sum((inputs[s].astype(acc) for s in FOUR[1:]), inputs[FOUR[0]].astype(acc))
    for site in FOUR:
        assert runs[site].result().tobytes() == expected.astype(dtype).tobytes()
    # who sends what to whom: every chunk's contributions straight to its owner, its
    # reduced values to each site from the site its route names
    expected_sent: Counter[tuple[str, str, str]] = Counter()
    itemsize = np.dtype(dtype).itemsize
    for share, route in plan.parts(20_000):
        assert route is not None
        n = len(chunks(share, itemsize, plan.cut_bytes))
        for site, via in zip(FOUR, route.via, strict=True):
            if site != share.owner:
                expected_sent[("rs", site, share.owner)] += n
                expected_sent[("ag", via, site)] += n
    assert sent == expected_sent
    assert any(via != share.owner for share, r in plan.parts(20_000) if r for via in r.via)


def test_mean_and_lossy_calls_with_routes() -> None:
    routes = (Route("a", ("a", "a", "b"), 1.0), Route("c", ("b", "c", "c"), 1.0))
    plan = Plan.equal(("a", "b", "c"), rate_bps=1.0, chunk_bytes=4096, routes=routes)
    rng = np.random.default_rng(3)
    inputs = {s: rng.standard_normal(5000).astype(np.float32) for s in "abc"}
    runs, sent = run_all(plan, inputs)
    exact = ((inputs["a"] + inputs["b"]) + inputs["c"]).astype(np.float32)
    assert all(runs[s].result().tobytes() == exact.tobytes() for s in "abc")
    assert sent[("ag", "b", "c")] > 0 and sent[("ag", "a", "c")] == 0
    # a lossy codec: owners send to every site (a relay could not pass the encoding on)
    runs, sent = run_all(plan, inputs, spec="int8")
    first = runs["a"].result()
    assert all(runs[s].result().tobytes() == first.tobytes() for s in "abc")
    assert sent[("ag", "b", "c")] == 0 and sent[("ag", "a", "c")] > 0
    assert all(not r.relayed() for r in runs.values())


def test_the_blocking_driver_passes_chunks_on_while_it_waits() -> None:
    """b relays a's chunks to c; a's reduced chunk is there, c's contribution to b's share
    is not: the driver passes the chunk on before it gives up waiting."""
    from tests.test_collective_plan import FakeGateway
    from wangate.collective.driver import Deadline, drive
    from wangate.errors import CollectiveTimeout

    routes = (Route("a", ("a", "a", "b"), 1.0), Route("b", ("b", "b", "b"), 1.0))
    plan = Plan.equal(("a", "b", "c"), rate_bps=1.0, chunk_bytes=4096, routes=routes)
    run = AllreduceRun(site="b", plan=plan, tag="g", array=np.ones(2048, np.float32))
    gw = FakeGateway()
    [share_a, _] = plan.parts(2048)
    first = f"@c/ag/{plan.digest}/0/g"
    gw.inbox[("a", first, 5)] = np.full(chunks(share_a[0], 4, 1024)[0].size, 3.0, np.float32)
    with pytest.raises(CollectiveTimeout, match="nothing arrived from c"):
        drive(gw, run, 5, Deadline(0.0), "allreduce 'g' step 5", "b")
    assert ("c", first, 5) in gw.sent


# -- the leader's plan and its announcement -------------------------------------------


def four_rates() -> dict[str, dict[str, float]]:
    rates: dict[str, dict[str, float]] = {s: {} for s in FOUR}
    for (a, b), r in FOUR_LINKS.items():
        rates[a][b] = rates[b][a] = r
    return rates


def test_the_leader_plans_over_links_once_every_link_has_a_rate() -> None:
    plan = Plan.equal(FOUR)
    reports = Reports("bj", plan, "g")
    rates = four_rates()
    planned = reports.plan_from_rates(rates)
    assert planned.weights == (0.7143, 1.0, 0.7143, 0.1429)
    assert planned.routes == gather_routes(FOUR, FOUR_LINKS)
    # one direction measured is enough (the other counts alike); 0 is "not measured"
    one_way = {s: {t: r for t, r in row.items() if s < t} for s, row in rates.items()}
    assert links_mbps(one_way, FOUR) == both_ways(FOUR_LINKS)
    assert reports.plan_from_rates(one_way) == planned
    # a link with no rate either way: each site's capacity, water-filled, no routes
    del rates["gz"]["sh"], rates["sh"]["gz"]
    assert links_mbps(rates, FOUR) is None
    fallback = reports.plan_from_rates(rates)
    assert fallback == reports.plan_from(capacities_mbps(rates, FOUR))
    assert fallback.routes == ()


def test_announcement_carries_the_routes() -> None:
    plan = Reports("bj", Plan.equal(FOUR), "g").plan_from_rates(four_rates())
    [message] = Reports("bj", plan, "g").announce(plan)
    values = decode_tensor(message.meta, bytes(message.payload))
    assert values.dtype == np.float64 and values.size == 4 + len(plan.routes) * 6
    first = plan.routes[0]
    assert values[4:10].tolist() == [
        FOUR.index(first.owner), *(FOUR.index(v) for v in first.via), first.weight,
    ]  # fmt: skip
    other = Reports("sh", Plan.equal(FOUR), "g")
    assert other.accept("bj", values) == plan
    for broken, message_part in [
        (values[:-1], "announced shares for other sites"),
        (np.concatenate([values[:4], [0, 0, 0, 0, 9, 1.0]]), "malformed routes from bj"),
        (np.concatenate([values[:4], [0, 0, 0, 0.5, 0, 1.0]]), "malformed routes from bj"),
        (np.concatenate([values[:4], [0, 1, 0, 0, 0, 1.0]]), "malformed routes from bj"),
        (np.concatenate([values[:4], [0, 0, 0, 0, 0, -1.0]]), "malformed routes from bj"),
    ]:
        with pytest.raises(CollectiveMismatch, match=message_part):
            other.accept("bj", broken)
