"""The link emulator's pure model under a fake clock: exact expectations."""

from __future__ import annotations

import pytest

from wangate.errors import ConfigError
from wangate.lab.bound import ideal_time_s, schedule
from wangate.lab.gilbert import GilbertElliott, GilbertElliottParams
from wangate.lab.link import LinkEmulator, LinkParams
from wangate.lab.scenario import SCENARIO_DIR, load_scenario, parse_scenario


def packet(index: int, size: int = 1250) -> bytes:
    return index.to_bytes(4, "big") + bytes(size - 4)


def drain(link: LinkEmulator, until: float, step: float = 1e-4) -> list[tuple[float, bytes]]:
    """Step a fake clock; return (time seen, packet) for every delivery."""
    out: list[tuple[float, bytes]] = []
    now = 0.0
    while now <= until:
        deadline = link.next_deadline()
        if deadline is None:
            break
        now = max(now, deadline)
        out += [(now, p) for p in link.pop_ready(now)]
    return out


def test_rate_limit_spaces_packets_by_serialisation_time() -> None:
    link = LinkEmulator(LinkParams(rate_mbps=10.0, queue_bytes=100_000))
    for i in range(5):
        link.push(packet(i), 0.0)
    deliveries = drain(link, 1.0)
    # 1250 bytes at 10 Mbit/s is exactly 1 ms each
    assert [t for t, _ in deliveries] == pytest.approx(
        [0.001, 0.002, 0.003, 0.004, 0.005], abs=1e-12
    )
    assert [p[:4] for _, p in deliveries] == [i.to_bytes(4, "big") for i in range(5)]


def test_queue_bound_tail_drops_exactly_the_overflow() -> None:
    link = LinkEmulator(LinkParams(rate_mbps=10.0, queue_bytes=5000))
    for i in range(10):
        link.push(packet(i), 0.0)
    assert link.stats.dropped_queue == 6  # 4 x 1250 bytes fit in 5000
    assert [p[:4] for _, p in drain(link, 1.0)] == [i.to_bytes(4, "big") for i in range(4)]
    # half a millisecond later the backlog has drained by 625 bytes: still no room
    link2 = LinkEmulator(LinkParams(rate_mbps=10.0, queue_bytes=5000))
    for i in range(4):
        link2.push(packet(i), 0.0)
    link2.push(packet(4), 0.0005)
    assert link2.stats.dropped_queue == 1
    link2.push(packet(5), 0.001)  # one packet fully sent: exactly room for one
    assert link2.stats.dropped_queue == 1


def test_delay_adds_to_serialisation() -> None:
    link = LinkEmulator(LinkParams(rate_mbps=10.0, delay_ms=20.0))
    link.push(packet(0), 1.0)
    assert link.next_deadline() == pytest.approx(1.021, abs=1e-12)
    assert link.pop_ready(1.0209) == []
    assert len(link.pop_ready(1.021)) == 1


def test_unlimited_rate_delivers_after_delay_only() -> None:
    link = LinkEmulator(LinkParams(delay_ms=5.0))
    for i in range(100):
        link.push(packet(i), 0.0)
    assert link.next_deadline() == pytest.approx(0.005)
    assert len(link.pop_ready(0.005)) == 100


def test_seeded_loss_is_reproducible_and_near_configured() -> None:
    def lost(seed: int) -> list[int]:
        link = LinkEmulator(LinkParams(loss=0.02), seed=seed)
        kept = []
        for i in range(20_000):
            link.push(packet(i, 64), 0.0)
            kept += [int.from_bytes(p[:4], "big") for p in link.pop_ready(0.0)]
        return sorted(set(range(20_000)) - set(kept))

    first, again, other = lost(7), lost(7), lost(8)
    assert first == again
    assert first != other
    assert 0.017 < len(first) / 20_000 < 0.023


def test_loss_pattern_does_not_depend_on_jitter() -> None:
    def dropped(jitter_ms: float) -> int:
        link = LinkEmulator(LinkParams(loss=0.1, jitter_ms=jitter_ms, delay_ms=10), seed=3)
        for i in range(2000):
            link.push(packet(i, 64), i * 0.001)
        return link.stats.dropped_loss

    assert dropped(0.0) == dropped(5.0)


def test_gilbert_elliott_burst_length_and_average() -> None:
    params = GilbertElliottParams.from_burst(5.0, 0.01)
    assert params.r == pytest.approx(0.2)
    assert params.average_loss == pytest.approx(0.01)
    import random

    chain = GilbertElliott(params, random.Random(1))
    outcomes = [chain.lose() for _ in range(400_000)]
    bursts, run = [], 0
    for lost in outcomes:
        if lost:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    assert 0.008 < sum(outcomes) / len(outcomes) < 0.012
    assert 4.5 < sum(bursts) / len(bursts) < 5.5


def test_blackhole_drops_new_packets_but_delivers_in_flight() -> None:
    link = LinkEmulator(LinkParams(delay_ms=10.0))
    link.push(packet(0), 0.0)
    link.apply(link.params.updated({"blackhole": True}), 0.001)
    link.push(packet(1), 0.002)
    assert link.stats.dropped_blackhole == 1
    assert [p[:4] for _, p in drain(link, 1.0)] == [(0).to_bytes(4, "big")]


def test_jitter_keeps_fifo_and_reorder_breaks_it() -> None:
    link = LinkEmulator(LinkParams(delay_ms=10.0, jitter_ms=5.0), seed=1)
    for i in range(500):
        link.push(packet(i, 64), i * 0.0001)
    order = [int.from_bytes(p[:4], "big") for _, p in drain(link, 10.0)]
    assert order == list(range(500))
    link = LinkEmulator(LinkParams(delay_ms=10.0, reorder=0.1, reorder_ms=5.0), seed=1)
    for i in range(500):
        link.push(packet(i, 64), i * 0.0001)
    order = [int.from_bytes(p[:4], "big") for _, p in drain(link, 10.0)]
    assert sorted(order) == list(range(500))
    assert order != list(range(500))
    assert link.stats.reordered > 0


def test_duplicate_delivers_two_copies() -> None:
    link = LinkEmulator(LinkParams(duplicate=1.0))
    link.push(packet(9), 0.0)
    assert link.pop_ready(0.0) == [packet(9), packet(9)]
    assert link.stats.duplicated == 1


def test_apply_changes_rate_for_later_packets() -> None:
    link = LinkEmulator(LinkParams(rate_mbps=10.0, queue_bytes=100_000))
    link.push(packet(0), 0.0)
    link.apply(link.params.updated({"rate_mbps": 1.0}), 0.0)
    link.push(packet(1), 0.0)
    times = [t for t, _ in drain(link, 1.0)]
    assert times == pytest.approx([0.001, 0.011], abs=1e-12)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="loss"):
        LinkParams(loss=1.5)
    with pytest.raises(ValueError, match="unknown"):
        LinkParams().updated({"latency": 3})


SUBJECTS = ("loss", "critical", "failover", "codecs", "coll", "multipath", "fair", "jobs")


def test_every_shipped_scenario_loads_and_is_named_by_subject() -> None:
    names = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    for required in (
        "multipath_clean3",
        "multipath_lossy_fast",
        "multipath_congest",
        "multipath_three_sites",
        "failover_blackhole",
        "failover_degrade",
        "critical_bulk",
        "critical_jitter",
        "loss_1",
        "loss_01",
        "loss_5",
        "loss_burst",
        "fair_tcp",
        "coll_3",
    ):
        assert required in names
    for name in names:
        assert name.split("_")[0] in SUBJECTS, f"{name}: not named <subject>_..."
        scenario = load_scenario(name)
        assert scenario.name == name
        # a scenario without a workload is driven by a bench module, and must say which
        drivers = ("python -m bench suite", "bench.collectives", "python -m bench jobs")
        assert scenario.flows or any(d in scenario.description for d in drivers), name


def test_scenario_details() -> None:
    degrade = load_scenario("failover_degrade_rounds")
    event = degrade.timeline[0]
    assert (event.at_s, event.path, event.direction) == (5.0, "a", "both")
    assert event.changes == {"delay_ms": 30, "loss": 0.02}
    swap = load_scenario("critical_jitter")
    assert [e.at_s for e in swap.timeline[:4]] == [0.3, 0.3, 0.6, 0.6]
    burst = load_scenario("loss_burst").paths[0].a_to_b
    assert burst.gilbert_elliott.average_loss == pytest.approx(0.01)
    three = load_scenario("multipath_three_sites")
    assert [p.address_a for p in three.paths] == [f"10.77.{i}.1" for i in range(1, 6)]


def test_ideal_bound_is_fluid_over_summed_rates() -> None:
    scenario = parse_scenario(
        {
            "sites": [{"name": "x"}, {"name": "y"}],
            "links": [
                {
                    "sites": ["x", "y"],
                    "paths": [
                        {"name": "p", "rate_mbps": 60, "delay_ms": 10},
                        {"name": "q", "rate_mbps": 40, "delay_ms": 30, "b_to_a": {"delay_ms": 5}},
                    ],
                }
            ],
            "workload": {
                "flows": [
                    {
                        "src": "x",
                        "dst": "y",
                        "steps": 2,
                        "interval_s": 0.1,
                        "messages": [{"name": "m", "size_bytes": 2_500_000}],
                    }
                ]
            },
        },
        "inline",
    )
    flow = scenario.flows[0]
    assert schedule(flow) == [(0.0, 2_500_000), (0.1, 2_500_000)]
    # 20 Mbit per message at 100 Mbit/s = 0.2 s each, back to back, + 10 ms
    assert ideal_time_s(scenario, flow) == pytest.approx(0.41)
    assert scenario.path("q").b_to_a.delay_ms == 5.0
    assert scenario.path("q").a_to_b.delay_ms == 30.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sites": [{"name": "x"}, {"name": "y"}], "links": [], "bogus": 1}, "bogus: unknown key"),
        (
            {
                "sites": [{"name": "x"}, {"name": "y"}],
                "links": [{"sites": ["x", "y"], "paths": [{"name": "p", "loss": 2}]}],
            },
            "loss",
        ),
        (
            {
                "sites": [{"name": "x"}, {"name": "y"}],
                "links": [{"sites": ["x", "z"], "paths": [{"name": "p"}]}],
            },
            "links[0].sites",
        ),
        (
            {
                "sites": [{"name": "x"}, {"name": "y"}],
                "links": [{"sites": ["x", "y"], "paths": [{"name": "p"}]}],
                "timeline": [{"at_s": 1, "path": "nope", "set": {}}],
            },
            "timeline[0].path",
        ),
    ],
)
def test_scenario_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(data, "file.toml")


def test_refuses_clearly_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from wangate.lab import netns

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netns.LabUnavailable, match="needs root"):
        netns.check_environment()


def test_forwarder_plays_the_timeline_on_its_directions() -> None:
    from wangate.lab.forwarder import Forwarder

    forwarder = Forwarder(
        {
            "path": "a",
            "fd_a": -1,
            "fd_b": -1,
            "seed": 1,
            "a_to_b": {"delay_ms": 5.0},
            "b_to_a": {"delay_ms": 5.0},
            "timeline": [(1.0, "a_to_b", {"delay_ms": 40.0}), (2.0, "both", {"loss": 0.5})],
        }
    )
    assert forwarder._play_timeline(100.0) is None  # not started: nothing applies
    forwarder.start_timeline(100.0)
    assert forwarder._play_timeline(100.5) == 101.0
    assert forwarder._play_timeline(101.0) == 102.0
    assert forwarder.links["a_to_b"].params.delay_ms == 40.0
    assert forwarder.links["b_to_a"].params.delay_ms == 5.0
    assert forwarder._play_timeline(102.0) is None
    assert forwarder.links["b_to_a"].params.loss == 0.5
    forwarder.start_timeline(200.0)  # restart: back to the initial parameters
    assert forwarder.links["a_to_b"].params == LinkParams(delay_ms=5.0)
