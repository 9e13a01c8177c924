"""Sans-IO tests of the collectives: plan and partition, chunks, the reduction runs driven
through an in-memory router (every message encoded and decoded by the real codec), and
the partial-membership agreement."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wangate.codec import decode_tensor
from wangate.collective import (
    AllreduceRun,
    BarrierRun,
    BroadcastRun,
    CollectiveMismatch,
    HopFeedback,
    Membership,
    Outgoing,
    Plan,
    Share,
    capacity_weights,
    check_user_tag,
    chunks,
)
from wangate.collective.arith import reduce_in_order
from wangate.collective.driver import Run
from wangate.errors import CollectiveError, LocalProtocolError

SITES = ("bj", "cd", "gz", "hz", "sh")


# -- plan --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 100, 1001])
@pytest.mark.parametrize("weights", [(1, 1, 1), (2, 1, 1), (1, 3, 0.5), (1e6, 1, 1)])
def test_shares_are_contiguous_cover_everything_and_follow_the_weights(
    n: int, weights: tuple[float, ...]
) -> None:
    plan = Plan(("a", "b", "c"), tuple(float(w) for w in weights))
    shares = plan.shares(n)
    assert [s.owner for s in shares] == ["a", "b", "c"]
    assert shares[0].start == 0 and shares[-1].stop == n
    assert all(x.stop == y.start for x, y in itertools.pairwise(shares))
    total = sum(weights)
    for share, w in zip(shares, weights, strict=True):
        assert abs(share.size - n * w / total) < 1  # largest remainder: off by < 1
    assert plan.shares(n) == shares  # deterministic


def test_shares_examples() -> None:
    plan = Plan.weighted(["sh", "bj"], {"bj": 2, "sh": 1})
    assert plan.sites == ("bj", "sh")
    assert plan.shares(10) == [Share("bj", 0, 7), Share("sh", 7, 10)]
    assert Plan.equal(["c", "a", "b"]).shares(4) == [
        Share("a", 0, 2),
        Share("b", 2, 3),
        Share("c", 3, 4),
    ]


def test_plan_rejects_bad_input() -> None:
    with pytest.raises(LocalProtocolError, match="sorted and unique"):
        Plan(("b", "a"), (1.0, 1.0))
    with pytest.raises(LocalProtocolError, match="weight of 'a'"):
        Plan(("a", "b"), (0.0, 1.0))
    with pytest.raises(LocalProtocolError, match="weight of 'b'"):
        Plan(("a", "b"), (1.0, float("nan")))
    with pytest.raises(LocalProtocolError, match="no collective weight for b"):
        Plan.weighted(["a", "b"], {"a": 1})
    with pytest.raises(LocalProtocolError, match="chunk_bytes"):
        Plan.equal(["a", "b"], chunk_bytes=10)


def test_digest_names_the_plan() -> None:
    a = Plan.equal(["bj", "sh"])
    assert a.digest == Plan.equal(["sh", "bj"]).digest
    assert len(a.digest) == 8
    assert a.digest != Plan.weighted(["bj", "sh"], {"bj": 2, "sh": 1}).digest
    assert a.digest != Plan.equal(["bj", "sh", "gz"]).digest
    assert a.digest != Plan.equal(["bj", "sh"], chunk_bytes=4096).digest


def test_chunks_cover_the_share_in_order() -> None:
    share = Share("a", 10, 1010)
    pieces = chunks(share, 4, 1024)  # 256 elements each
    assert [(c.start, c.stop) for c in pieces] == [(10, 266), (266, 522), (522, 778), (778, 1010)]
    assert chunks(Share("a", 5, 5), 4, 1024) == []
    assert [c.size for c in chunks(Share("a", 0, 3), 8, 1)] == [1, 1, 1]


def test_direct_exchange_by_the_bound() -> None:
    assert Plan.equal(["a", "b"]).direct(1 << 30)  # two sites: same bytes, one crossing
    three = Plan.equal(["a", "b", "c"], rate_bps=100e6, latency_s=0.030)
    # (n-1)(1-2/n) B 8 / rate < latency  <=>  B < 0.03 * 100e6 / 8 * 1.5 = 562,500 bytes
    assert three.direct(562_000) and not three.direct(563_000)
    assert Plan.equal(["a", "b", "c"], latency_s=0.0).direct(1) is False


def test_capacity_weights_floor_and_scale() -> None:
    # water-filling: the sites with a share finish together (t = 4/160: s = 0.5, 0.5, 0)
    assert capacity_weights({"bj": 60.0, "sh": 60.0, "gz": 40.0}) == {
        "bj": 1.0,
        "sh": 1.0,
        "gz": 0.05,
    }
    # four sites, all own a share: t = 6/310, s = (t C - 1) / 2 = .468, .274, .081, .177
    four = capacity_weights({"a": 100.0, "b": 80.0, "c": 60.0, "d": 70.0})
    assert four == {"a": 1.0, "b": 0.5862, "c": 0.1724, "d": 0.3793}
    assert capacity_weights({"a": 100.0, "b": 50.0, "c": 0.0}) == {"a": 1.0, "b": 0.05, "c": 0.05}
    assert capacity_weights({"a": 5.0, "b": 5.0, "c": 5.0}) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert capacity_weights({"a": 0.0, "b": 0.0}) == {"a": 1.0, "b": 1.0}
    assert capacity_weights({"a": 10.0, "b": 90.0}) == {"a": 1.0, "b": 1.0}  # direct exchange
    assert capacity_weights({}) == {}


def test_reserved_tags() -> None:
    check_user_tag("bucket0")
    with pytest.raises(LocalProtocolError, match="reserved for collectives"):
        check_user_tag("@c/rs/x")


# -- runs through an in-memory router ------------------------------------------------------


def route(runs: Mapping[str, Run], order: str = "fifo") -> int:
    """Start every run, deliver messages (decoded by the real codec) until all are done;
    returns the number of messages moved."""
    inbox: dict[tuple[str, str, str], np.ndarray] = {}  # (to, tag, from) -> array
    moved = 0

    def post(site: str, messages: list[Outgoing]) -> None:
        nonlocal moved
        for out in messages:
            assert site not in out.peers
            for peer in out.peers:
                key = (peer, out.tag, site)
                assert key not in inbox, f"duplicate {key}"
                inbox[key] = decode_tensor(out.meta, bytes(out.payload))
                moved += 1

    names = sorted(runs) if order == "fifo" else sorted(runs, reverse=True)
    for name in names:
        post(name, runs[name].start())
    while not all(run.done for run in runs.values()):
        progressed = False
        for name in names:
            for want in runs[name].wanted():
                array = inbox.pop((name, want.tag, want.source), None)
                if array is not None:
                    post(name, runs[name].receive(want.source, want.tag, array))
                    progressed = True
        assert progressed, "deadlock"
    assert not inbox, f"unconsumed: {sorted(inbox)}"
    return moved


def reference(inputs: Mapping[str, np.ndarray], op: str) -> np.ndarray:
    """Sum in sorted site order, float16 accumulated in float32, written out by hand."""
    dtype = next(iter(inputs.values())).dtype
    acc_dtype = np.dtype(np.float32) if dtype == np.float16 else dtype
    acc = None
    for site in sorted(inputs):
        value = inputs[site].astype(acc_dtype)
        acc = value.copy() if acc is None else acc + value
    assert acc is not None
    if op == "mean":
        acc = acc / acc_dtype.type(len(inputs))
    return acc.astype(dtype)


def make_input(site: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng([ord(c) for c in site] + list(shape))
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def allreduce_all(
    sites: tuple[str, ...],
    shape: tuple[int, ...],
    dtype: str,
    op: str,
    plan: Plan,
    spec: str = "none",
    feedback: Mapping[str, HopFeedback] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, AllreduceRun], dict[str, np.ndarray]]:
    inputs = {s: make_input(s, shape, dtype) for s in sites}
    runs = {
        s: AllreduceRun(
            site=s,
            plan=plan,
            tag="grad",
            array=inputs[s],
            op=op,
            spec=spec,
            feedback=None if feedback is None else feedback[s],
        )
        for s in sites
    }
    route(runs)
    return inputs, runs, {s: r.result() for s, r in runs.items()}


SHAPES = [(), (1,), (5,), (3, 4), (1000,), (17, 3, 5)]
DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint16", "int8"]


@pytest.mark.parametrize("n_sites", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_is_exact_and_identical_everywhere(
    n_sites: int, shape: tuple[int, ...], dtype: str
) -> None:
    sites = SITES[:n_sites]
    # a tiny rate makes every tensor go through reduce-scatter/all-gather for n > 2
    plan = Plan.equal(sites, rate_bps=1.0, chunk_bytes=1024)
    inputs, runs, results = allreduce_all(sites, shape, dtype, "sum", plan)
    expected = reference(inputs, "sum")
    for site in sites:
        assert results[site].shape == shape and results[site].dtype == np.dtype(dtype)
        assert results[site].tobytes() == expected.tobytes()
        assert runs[site].direct == (n_sites <= 2)


@pytest.mark.parametrize("n_sites", [2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("rate_bps", [1.0, 1e12])  # reduce-scatter/all-gather, then direct
def test_allreduce_mean_is_exact_both_algorithms(n_sites: int, dtype: str, rate_bps: float) -> None:
    sites = SITES[:n_sites]
    plan = Plan.weighted(
        sites, {s: float(i + 1) for i, s in enumerate(sites)}, rate_bps=rate_bps, chunk_bytes=1024
    )
    inputs, runs, results = allreduce_all(sites, (3001,), dtype, "mean", plan)
    expected = reference(inputs, "mean")
    assert all(results[s].tobytes() == expected.tobytes() for s in sites)
    assert runs[sites[0]].direct == (n_sites == 2 or rate_bps > 1)


def test_message_counts_of_the_two_algorithms() -> None:
    sites = SITES[:3]
    n = 3000  # float32: 12000 bytes; chunks of 1024 bytes = 256 elements
    plan = Plan.equal(sites, rate_bps=1.0, chunk_bytes=1024)
    runs = {
        s: AllreduceRun(site=s, plan=plan, tag="g", array=np.ones(n, np.float32)) for s in sites
    }
    moved = route(runs)
    per_share = [len(chunks(share, 4, 1024)) for share in plan.shares(n)]
    # each chunk goes to its owner from 2 sites, then from its owner to 2 sites
    assert moved == sum(per_share) * 2 * 2
    direct = Plan.equal(sites, rate_bps=1e12, chunk_bytes=1024)
    runs = {
        s: AllreduceRun(site=s, plan=direct, tag="g", array=np.ones(n, np.float32)) for s in sites
    }
    assert route(runs) == len(chunks(Share("x", 0, n), 4, 1024)) * 3 * 2


def test_lossy_codec_gives_identical_results_and_keeps_residuals_per_hop() -> None:
    sites = SITES[:3]
    plan = Plan.equal(sites, rate_bps=1.0, chunk_bytes=4096)
    feedback = {s: HopFeedback() for s in sites}
    inputs, _, results = allreduce_all(sites, (5000,), "float32", "mean", plan, "int8", feedback)
    first = results[sites[0]]
    assert all(results[s].tobytes() == first.tobytes() for s in sites)
    exact = reference(inputs, "mean")
    assert not np.array_equal(first, exact)
    assert np.max(np.abs(first - exact)) < 0.05
    for s in sites:  # both hops of a reduce-scatter/all-gather keep a residual
        rs, ag = feedback[s].residual("grad", "rs"), feedback[s].residual("grad", "ag")
        assert rs is not None and ag is not None and rs.size == ag.size == 5000
        share = next(x for x in plan.shares(5000) if x.owner == s)
        # the reduce-scatter residual covers what this site sent to others, not its share
        assert not np.any(rs[share.start : share.stop])
        assert np.any(rs) and np.any(ag[share.start : share.stop])
        assert not np.any(np.delete(ag, np.arange(share.start, share.stop)))


def test_error_feedback_makes_repeated_lossy_allreduces_converge() -> None:
    """The mean over steps of lossy results approaches the exact mean: nothing is lost."""
    sites = SITES[:3]
    plan = Plan.equal(sites, rate_bps=1.0, chunk_bytes=4096)
    feedback = {s: HopFeedback() for s in sites}
    inputs = {s: make_input(s, (2000,), "float32") for s in sites}
    exact = reference(inputs, "sum")
    total = np.zeros(2000, np.float64)
    steps = 50
    for _ in range(steps):
        runs = {
            s: AllreduceRun(
                site=s, plan=plan, tag="g", array=inputs[s], spec="topk:0.05", feedback=feedback[s]
            )
            for s in sites
        }
        route(runs)
        total += runs[sites[0]].result()
    one_step = np.abs(runs[sites[0]].result() - exact).mean()
    assert np.abs(total / steps - exact).mean() < one_step / 5


def test_shape_mismatch_is_named() -> None:
    plan = Plan.equal(SITES[:2])
    runs: dict[str, Run] = {
        "bj": AllreduceRun(site="bj", plan=plan, tag="g", array=np.ones(10, np.float32)),
        "cd": AllreduceRun(site="cd", plan=plan, tag="g", array=np.ones(12, np.float32)),
    }
    with pytest.raises(CollectiveMismatch, match="cd sent 12 float32 elements"):
        route(runs)


def test_allreduce_refuses_what_it_cannot_reduce() -> None:
    plan = Plan.equal(SITES[:2])
    with pytest.raises(LocalProtocolError, match="op 'mean' needs a float"):
        AllreduceRun(site="bj", plan=plan, tag="g", array=np.ones(3, np.int32), op="mean")
    with pytest.raises(LocalProtocolError, match="cannot reduce a bool"):
        AllreduceRun(site="bj", plan=plan, tag="g", array=np.ones(3, bool))
    with pytest.raises(LocalProtocolError, match="op must be one of"):
        AllreduceRun(site="bj", plan=plan, tag="g", array=np.ones(3), op="max")
    with pytest.raises(LocalProtocolError, match="not among"):
        AllreduceRun(site="gz", plan=plan, tag="g", array=np.ones(3))
    with pytest.raises(LocalProtocolError, match="reserved"):
        AllreduceRun(site="bj", plan=plan, tag="@c/x", array=np.ones(3))
    with pytest.raises(LocalProtocolError, match="at most 200"):
        AllreduceRun(site="bj", plan=plan, tag="x" * 201, array=np.ones(3))


def test_reduce_in_order_is_the_documented_sequence() -> None:
    parts = [np.array([1e8], np.float32), np.array([1.0], np.float32), np.array([-1e8], np.float32)]
    # (1e8 + 1) rounds to 1e8 in float32, then - 1e8 = 0: order matters, and this is it
    assert reduce_in_order(parts, "sum", np.dtype(np.float32), 3)[0] == 0.0
    halves = [np.array([60000], np.float16), np.array([60000], np.float16)]
    # float16 accumulates in float32: the mean does not overflow
    assert reduce_in_order(halves, "mean", np.dtype(np.float16), 2)[0] == 60000


# -- broadcast and barrier -------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (0,), (5,), (300, 7)])
@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8", "float64"])
def test_broadcast_delivers_the_roots_array(shape: tuple[int, ...], dtype: str) -> None:
    sites = SITES[:4]
    array = make_input("gz", shape, dtype)
    runs = {
        s: BroadcastRun(
            site=s,
            sites=sites,
            tag="p",
            root="gz",
            array=array if s == "gz" else None,
            chunk_bytes=1024,
        )
        for s in sites
    }
    route(runs)
    for s in sites:
        got = runs[s].result()
        assert got.shape == shape and got.dtype == np.dtype(dtype)
        assert got.tobytes() == array.tobytes()


def test_broadcast_checks_what_a_non_root_passed() -> None:
    sites = SITES[:2]
    runs = {
        "bj": BroadcastRun(site="bj", sites=sites, tag="p", root="bj", array=np.ones(3)),
        "cd": BroadcastRun(site="cd", sites=sites, tag="p", root="bj", array=np.ones(4)),
    }
    with pytest.raises(CollectiveMismatch, match=r"shape \(3,\), this site passed float64"):
        route(runs)
    with pytest.raises(LocalProtocolError, match="root bj must pass an array"):
        BroadcastRun(site="bj", sites=sites, tag="p", root="bj", array=None)


def test_barrier_completes_only_with_every_token() -> None:
    sites = SITES[:3]
    runs = {s: BarrierRun(site=s, sites=sites, tag="b") for s in sites}
    assert route(runs) == 6
    lonely = BarrierRun(site="bj", sites=sites, tag="b")
    lonely.start()
    assert not lonely.done and {w.source for w in lonely.wanted()} == {"cd", "gz"}


# -- partial membership ------------------------------------------------------------------


def agree(plan: Plan, heard: Mapping[str, set[str]]) -> dict[str, Plan | Exception]:
    """Each site hears the joins in ``heard[site]``; plans travel from whom each takes for
    leader. Returns each site's plan, or the error it would raise (no plan for it)."""
    members = {s: Membership(site=s, plan=plan, tag="g") for s in heard}
    outcome: dict[str, Plan | Exception] = {}
    sent: dict[tuple[str, str], np.ndarray] = {}  # plan messages by (recipient, leader)
    for site, member in members.items():
        for source in heard[site]:
            member.joined(source)
        if member.leader == site:
            agreed, messages = member.decide()
            outcome[site] = agreed
            for out in messages:
                for peer in out.peers:
                    sent[(peer, site)] = decode_tensor(out.meta, bytes(out.payload))
    for site, member in members.items():
        if member.leader != site:
            word = sent.get((site, member.leader))
            if word is None:
                outcome[site] = TimeoutError(f"no plan from {member.leader}")
            else:
                try:
                    outcome[site] = member.accept(member.leader, word)
                except CollectiveError as exc:
                    outcome[site] = exc
    return outcome


def test_membership_everyone_present() -> None:
    plan = Plan.weighted(["a", "b", "c"], {"a": 1, "b": 2, "c": 3})
    out = agree(plan, {"a": {"b", "c"}, "b": {"a", "c"}, "c": {"a", "b"}})
    assert all(p == plan for p in out.values())


def test_membership_a_missing_site_is_left_out_by_all() -> None:
    plan = Plan.weighted(["a", "b", "c", "d"], {"a": 1, "b": 2, "c": 3, "d": 4})
    out = agree(plan, {"a": {"b", "c"}, "b": {"a", "c"}, "c": {"a", "b"}})
    expected = plan.restricted(["a", "b", "c"])
    assert out == {"a": expected, "b": expected, "c": expected}
    assert expected.weights == (1.0, 2.0, 3.0)


def test_membership_a_late_site_gets_no_plan_of_its_own() -> None:
    """c was late: a and b closed their windows without it; c heard both. c takes a for
    leader, but a sends its plan only to its members: c times out, a and b agree."""
    plan = Plan.equal(["a", "b", "c"])
    out = agree(plan, {"a": {"b"}, "b": {"a"}, "c": {"a", "b"}})
    assert out["a"] == out["b"] == plan.restricted(["a", "b"])
    assert isinstance(out["c"], TimeoutError) and "no plan from a" in str(out["c"])


def test_membership_disagreeing_leaders_never_give_two_plans_to_one_run() -> None:
    """a was slow: b and c did not hear it, a heard both. b leads {b, c}; a leads {a, b, c}
    but b and c wait for b's plan, not a's. b and c agree; a's plan is used by no one
    else, so a's run (under its own plan digest) times out instead of mixing in."""
    plan = Plan.equal(["a", "b", "c"])
    out = agree(plan, {"a": {"b", "c"}, "b": {"c"}, "c": {"b"}})
    assert out["b"] == out["c"] == plan.restricted(["b", "c"])
    assert out["a"] == plan
    assert isinstance(out["a"], Plan) and out["a"].digest != out["b"].digest  # type: ignore[union-attr]


def test_membership_plan_message_is_checked() -> None:
    plan = Plan.equal(["a", "b", "c"])
    member = Membership(site="b", plan=plan, tag="g")
    with pytest.raises(CollectiveMismatch, match="plan for other sites"):
        member.accept("a", np.ones(2))
    with pytest.raises(CollectiveMismatch, match="malformed plan"):
        member.accept("a", np.array([1.0, float("nan"), 1.0]))
    assert member.accept("a", np.array([1.0, 1.0, 0.0])).sites == ("a", "b")
    with pytest.raises(CollectiveError, match="a left b out of this step"):
        member.accept("a", np.array([1.0, 0.0, 1.0]))


def test_config_weights(tmp_path: Path) -> None:
    from wangate.config import parse_config
    from wangate.errors import ConfigError
    from wangate.loopback import write_site_configs

    sites = write_site_configs(tmp_path, 3, 1)
    base = sites[0].config_path.read_text()

    def load(extra: str) -> object:
        return parse_config(base + "\n" + extra, sites[0].config_path)

    config = load("[collective]\nweights = {bj = 2, sh = 1, gz = 1.5}\nchunk_bytes = 65536\n")
    assert config.collective_settings() == {  # type: ignore[attr-defined]
        "peers": ["gz", "sh"],
        "weights": {"bj": 2.0, "gz": 1.5, "sh": 1.0},
        "chunk_bytes": 65536,
        "rate_mbps": 100.0,
        "delay_ms": 30.0,
    }
    bad = {
        "weights = {bj = 2, sh = 1}": "no weight for gz",
        "weights = {bj = 2, sh = 1, gz = 1, xx = 1}": r"weights\.xx: 'xx' is not this site",
        "weights = {bj = 0, sh = 1, gz = 1}": r"weights\.bj: 0 is out of range",
        "weights = {bj = true, sh = 1, gz = 1}": "expected a number, got boolean",
        "weights = 3": "expected a table",
        "chunk_bytes = 10": r"chunk_bytes: 10 is out of range",
        "delay_ms = -1": r"delay_ms: -1 is out of range",
        "rate_mbps = 'fast'": r"rate_mbps: expected a number",
        "other = 1": "unknown key",
    }
    for text, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            load("[collective]\n" + text + "\n")


def test_golden_plan_digest_tags_and_announcement() -> None:
    """The examples of proto/collective.md and proto/vectors/collective_*.hex."""
    from wangate.collective.capacity import Reports
    from wangate.collective.tags import wire_tag

    plan = Plan.weighted(["bj", "gz", "sh"], {"bj": 2, "gz": 1, "sh": 1})
    assert plan.digest == "f2ad5656"
    assert Plan.equal(plan.sites).digest == "2739127a"
    assert wire_tag("rs", plan.digest, 3, "bucket0") == "@c/rs/f2ad5656/3/bucket0"
    assert plan.shares(10) == [Share("bj", 0, 5), Share("gz", 5, 8), Share("sh", 8, 10)]
    text = Path(__file__).resolve().parent.parent / "proto/vectors/collective_plan_announcement.hex"
    lines = [ln for ln in text.read_text().splitlines() if not ln.startswith("#")]
    vector = bytes.fromhex(" ".join(lines))
    reports = Reports("bj", plan, "bucket0")
    [message] = reports.announce(plan)
    assert message.tag == "@c/pl/2739127a/1/bucket0" and message.peers == ("gz", "sh")
    assert message.meta + bytes(message.payload) == vector
    meta_len = len(message.meta)
    received = decode_tensor(vector[:meta_len], vector[meta_len:])
    assert Reports("sh", plan, "bucket0").accept("bj", received) == plan


def test_measured_shares_from_reports() -> None:
    from dataclasses import replace

    from wangate.collective.capacity import Reports, out_rates_mbps
    from wangate.rows import PathRow

    def row(
        peer: str, state: Any, capacity_mbps: float | None, rate_mbps: float | None = 0.0
    ) -> PathRow:
        down = PathRow.not_connected(peer, "p", "*", "(peer dials)")
        return replace(down, state=state, capacity_mbps=capacity_mbps, rate_mbps=rate_mbps)

    rows = [
        row("gz", "up", 70.0),  # capacity, not the delivery rate of the last 10 s (0)
        row("gz", "up", None, 10.0),  # a gateway without capacity_mbps: its rate
        row("gz", "down", 500.0),  # down: not counted
        row("sh", "degraded", 20.0, 3.0),
        row("xx", "up", 900.0),  # not in the call
        row("sh", "up", float("nan")),
        row("sh", "up", None, None),  # not measured yet
    ]
    assert out_rates_mbps(rows, ("gz", "sh")) == {"gz": 80.0, "sh": 20.0}
    plan = Plan.equal(["bj", "gz", "sh"])
    reports = Reports("bj", plan, "g")
    assert reports.plan_from({}).weights == (1.0, 1.0, 1.0)
    # sh unmeasured counts as the mean (75): bj and sh own shares, gz the floor
    assert reports.plan_from({"bj": 100.0, "gz": 50.0, "sh": 0.0}).weights == (1.0, 0.05, 0.4)
    # t = 4/240: shares 1/2, 1/3, 1/6
    assert reports.plan_from({"bj": 90.0, "gz": 80.0, "sh": 70.0}).weights == (1.0, 0.6667, 0.3333)
    [report] = Reports("sh", plan, "g").report("bj", rows)
    assert report.peers == ("bj",) and report.tag == reports.report_tag and report.critical
    decoded = decode_tensor(report.meta, bytes(report.payload))
    assert decoded.tolist() == [0.0, 80.0, 0.0]  # sh's rate to bj, gz, sh (sh has no bj row)
    assert reports.read_report("sh", decoded) == {"bj": 0.0, "gz": 80.0}
    # a one-value report (a total) is spread over the other sites
    assert reports.read_report("sh", np.array([60.0])) == {"bj": 30.0, "gz": 30.0}
    with pytest.raises(CollectiveMismatch, match="malformed report from sh"):
        reports.read_report("sh", np.array([-1.0]))
    with pytest.raises(CollectiveMismatch, match="malformed report from sh"):
        reports.read_report("sh", np.array([1.0, 2.0]))
    with pytest.raises(CollectiveMismatch, match="announced shares for other sites"):
        reports.accept("bj", np.ones(2))
    with pytest.raises(CollectiveMismatch, match="malformed shares from bj"):
        reports.accept("bj", np.array([1.0, 0.0, 1.0]))


def test_capacity_is_the_slower_of_in_and_out() -> None:
    """gz sends fast but receives slowly: its capacity is what arrives into it."""
    from wangate.collective.capacity import capacities_mbps

    sites = ("bj", "gz", "sh")
    rates = {
        "bj": {"gz": 10.0, "sh": 40.0},
        "gz": {"bj": 40.0, "sh": 40.0},
        "sh": {"bj": 40.0, "gz": 10.0},
    }
    # out: bj 50, gz 80, sh 50; in: bj 80, gz 20, sh 80
    assert capacities_mbps(rates, sites) == {"bj": 50.0, "gz": 20.0, "sh": 50.0}
    # sh not heard from yet: rates into bj and gz from sh count as theirs to sh
    partial = {"bj": rates["bj"], "gz": rates["gz"]}
    assert capacities_mbps(partial, sites) == {"bj": 50.0, "gz": 50.0, "sh": 80.0}
    # only the leader's own rates: the others' capacities are unknown (0: the mean later)
    assert capacities_mbps({"bj": rates["bj"]}, sites) == {"bj": 50.0, "gz": 0.0, "sh": 0.0}


class FakeGateway:
    """A transport for the blocking driver: messages posted by test code, recvs that
    time out at once when nothing matches (no clock: the deadline is never waited)."""

    def __init__(self) -> None:
        self.inbox: dict[tuple[str, str, int], np.ndarray] = {}
        self.sent: list[tuple[str, str, int]] = []
        self.claims: list[tuple[str, int]] = []
        self.calls: list[str] = []  # "claim" / "send", in order
        self.collision: Exception | None = None  # what ``claim`` raises, if anything

    def claim(self, call: str, step: int) -> None:
        self.calls.append("claim")
        self.claims.append((call, step))
        if self.collision is not None:
            raise self.collision

    def paths(self) -> list[dict[str, Any]]:
        return []

    def send_encoded(
        self,
        peer: str,
        tag: str,
        meta: bytes,
        payload: memoryview,
        checksum: int,
        *,
        step: int,
        critical: bool,
    ) -> int:
        self.calls.append("send")
        self.sent.append((peer, tag, step))
        return len(self.sent)

    def recv(
        self, tag: str, *, source: str | None, step: int | None, timeout: float | None
    ) -> np.ndarray:
        from wangate.errors import RecvTimeout

        assert source is not None and step is not None
        found = self.inbox.pop((source, tag, step), None)
        if found is None:
            raise RecvTimeout("no message", code="timeout")
        return found


def test_driver_timeout_names_the_silent_sites_and_what_arrived() -> None:
    from wangate.collective.driver import Deadline, drive
    from wangate.errors import CollectiveTimeout

    plan = Plan.equal(["bj", "gz", "sh"], rate_bps=1.0, chunk_bytes=1024)
    run = AllreduceRun(site="bj", plan=plan, tag="g", array=np.ones(3000, np.float32))
    gw = FakeGateway()
    # gz sends its contributions to bj's share; sh sends nothing at all
    every_chunk = [c for share in plan.shares(3000) for c in chunks(share, 4, 1024)]
    bj_chunks = [(i, c) for i, c in enumerate(every_chunk) if c.owner == "bj"]
    for index, chunk in bj_chunks:
        gw.inbox[("gz", f"@c/rs/{plan.digest}/{index}/g", 5)] = np.ones(chunk.size, np.float32)
    with pytest.raises(CollectiveTimeout) as caught:
        drive(gw, run, 5, Deadline(0.0), "allreduce 'g' step 5", "bj")
    error = caught.value
    gz_owned = sum(1 for c in every_chunk if c.owner == "gz")
    assert error.missing == ("sh",)
    assert error.arrived == {"gz": len(bj_chunks)}
    assert str(error) == (
        "allreduce 'g' step 5 at bj timed out after 0 s: nothing arrived from sh; "
        f"{len(bj_chunks)} of {len(bj_chunks) + gz_owned} messages from gz "
        "(did those sites call it with the same tag, step and sites?)"
    )  # gz's slices of bj's share arrived; gz's reduced chunks cannot come without sh
    # bj sent its slices of gz's and sh's chunks to their owners, at step 5
    assert {peer for peer, _, _ in gw.sent} == {"gz", "sh"}
    assert all(step == 5 and "/rs/" in tag for _, tag, step in gw.sent)


# ------------------------------------------------------------------ claims


def _scripts(site: str) -> dict[str, Any]:
    from wangate.collective.api import (
        CollectiveState,
        allreduce_script,
        barrier_script,
        broadcast_script,
    )

    settings: dict[str, Any] = {"collective": {"peers": ["sh"], "weights": {}}}
    array = np.ones(16, np.float32)
    return {
        "allreduce/ddp.b0": allreduce_script(
            site, settings, CollectiveState(), lambda *_: "none", "ddp.b0", array,
            step=3, op="sum", codec=None, critical=False, timeout=0.0, sites=None,
            partial=False,
        ),
        "broadcast/ddp.b0": broadcast_script(
            site, settings, "ddp.b0", array, root=site, step=3, timeout=0.0, sites=None
        ),
        "barrier/ddp.b0": barrier_script(site, settings, "ddp.b0", step=3, timeout=0.0, sites=None),
    }  # fmt: skip


@pytest.mark.parametrize("call", ["allreduce/ddp.b0", "broadcast/ddp.b0", "barrier/ddp.b0"])
def test_a_collective_claims_its_call_before_it_sends_anything(call: str) -> None:
    from wangate.collective.steps import run_sync
    from wangate.errors import CollectiveTimeout

    gw = FakeGateway()
    with contextlib.suppress(CollectiveTimeout):  # sh never answers (the root needs none)
        run_sync(gw, _scripts("bj")[call])
    assert gw.claims == [(call, 3)]  # kind/tag, at the call's step, once
    assert gw.calls[0] == "claim" and "send" in gw.calls


@pytest.mark.parametrize("call", ["allreduce/ddp.b0", "broadcast/ddp.b0", "barrier/ddp.b0"])
def test_a_collision_fails_the_call_with_nothing_sent(call: str) -> None:
    from wangate.collective.steps import run_sync
    from wangate.errors import ErrorCode, GatewayError

    gw = FakeGateway()
    gw.collision = GatewayError("collision: ...", code=ErrorCode.COLLISION)
    with pytest.raises(GatewayError) as refused:
        run_sync(gw, _scripts("bj")[call])
    assert refused.value is gw.collision and refused.value.code == "collision"
    assert gw.claims == [(call, 3)] and gw.sent == []


def test_a_call_whose_inputs_are_wrong_claims_nothing() -> None:
    from wangate.collective.api import barrier_script
    from wangate.collective.steps import run_sync

    gw = FakeGateway()
    with pytest.raises(LocalProtocolError):
        run_sync(gw, barrier_script("bj", {}, "ddp.b0", step=3, timeout=0.0, sites=["sh"]))
    assert gw.claims == [] and gw.sent == []
