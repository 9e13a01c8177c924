"""The collectives behind ``Client`` and ``AsyncClient``: inputs checked, plan chosen, run driven.

Each collective is one script (a generator of ``steps.py``'s steps) that both clients
carry out (``steps.run_sync``, ``steps.run_async``). The arithmetic
runs here, in the trainer's process: the daemon's core stays with the transport
(bench/collectives/loopback.py measures what the arithmetic costs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from wangate.errors import LocalProtocolError

from .allreduce import AllreduceRun
from .arith import check_reducible
from .capacity import Reports, out_rates_mbps
from .driver import collect_joins, drive_steps, send_all, timeout_error
from .exchange import CollectiveTimeout, Expected
from .feedback import HopFeedback
from .membership import Membership
from .plan import DEFAULT_CHUNK_BYTES, DEFAULT_LATENCY_S, DEFAULT_RATE_BPS, Plan
from .small import BarrierRun, BroadcastRun
from .steps import Claim, Deadline, PathRows, RecvOne, Script, Step, run_async, run_sync
from .tags import check_collective_tag

__all__ = ["CollectiveState", "PartialResult", "run_async", "run_sync"]

MAX_STEP = (1 << 63) - 1
ChooseSpec = Callable[[str, int, str | None, np.dtype[Any]], str]


@dataclass(frozen=True)
class PartialResult:
    """``allreduce(..., partial=True)``: the reduction over ``contributors`` (sorted)."""

    array: np.ndarray
    contributors: tuple[str, ...]


class CollectiveState:
    """Per-client state: error feedback per hop; as leader, the capacities reported."""

    def __init__(self) -> None:
        self.feedback = HopFeedback()
        # site -> its measured rate to each other site: the latest reports, as the leader
        # saw them, and the leader's own
        self.rates_mbps: dict[str, dict[str, float]] = {}


def call_sites(site: str, settings: Mapping[str, Any], sites: Iterable[str] | None) -> Plan:
    """The plan over ``sites`` (default: every site of the gateway's config), weighted by
    ``[collective] weights`` when the gateway has them."""
    config = settings.get("collective", {})
    known = [site, *config.get("peers", ())] if "peers" in config else None
    if sites is None:
        if known is None:
            raise LocalProtocolError(
                "this gateway does not announce its sites: pass sites=[...] explicitly"
            )
        chosen = known
    else:
        if isinstance(sites, str):
            raise LocalProtocolError("sites must be a list of site names, not one string")
        chosen = list(sites)
        if not all(isinstance(s, str) and s for s in chosen) or len(set(chosen)) != len(chosen):
            raise LocalProtocolError(f"sites must be distinct site names, got {chosen!r}")
        if site not in chosen:
            raise LocalProtocolError(f"sites {chosen!r} must include this site {site!r}")
        if known is not None and not set(chosen) <= set(known):
            unknown = sorted(set(chosen) - set(known))
            raise LocalProtocolError(f"sites {unknown} are not peers of this gateway ({site})")
    bound = {
        "chunk_bytes": int(config.get("chunk_bytes", DEFAULT_CHUNK_BYTES)),
        "rate_bps": float(config.get("rate_mbps", DEFAULT_RATE_BPS / 1e6)) * 1e6,
        "latency_s": float(config.get("delay_ms", DEFAULT_LATENCY_S * 1e3)) / 1e3,
    }
    weights = config.get("weights") or {}
    if weights and all(s in weights for s in chosen):
        return Plan.weighted(chosen, weights, **bound)
    return Plan.equal(chosen, **bound)


def _check_common(tag: str, step: int, timeout: float) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise LocalProtocolError(f"step must be an integer in 0..2^63-1, got {step!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise LocalProtocolError(f"timeout must be a number of seconds, got {timeout!r}")
    if not (math.isfinite(timeout) and timeout >= 0):
        raise LocalProtocolError(f"timeout must be finite and >= 0, got {timeout!r}")


def _allreduce_run(
    site: str,
    plan: Plan,
    state: CollectiveState,
    choose: ChooseSpec,
    tag: str,
    array: np.ndarray,
    op: str,
    codec: str | None,
    critical: bool,
) -> AllreduceRun:
    spec = choose(tag, array.nbytes, codec, array.dtype)
    return AllreduceRun(
        site=site,
        plan=plan,
        tag=tag,
        array=array,
        op=op,
        spec=spec,
        critical=critical,
        feedback=state.feedback,
    )


def _what(kind: str, tag: str, step: int) -> str:
    return f"{kind} {tag!r} step {step}"


def allreduce_script(
    site: str,
    settings: Mapping[str, Any],
    state: CollectiveState,
    choose: ChooseSpec,
    tag: str,
    array: np.ndarray,
    *,
    step: int,
    op: str,
    codec: str | None,
    critical: bool,
    timeout: float,
    sites: Iterable[str] | None,
    partial: bool,
) -> Script[np.ndarray | PartialResult]:
    _check_common(tag, step, timeout)
    array = np.asarray(array)
    plan = call_sites(site, settings, sites)
    measured = not settings.get("collective", {}).get("weights")
    check_collective_tag(tag)  # the inputs are checked before anything is sent
    check_reducible(array.dtype, op)
    deadline = Deadline(timeout)
    yield Claim(f"allreduce/{tag}", step)
    what = _what("allreduce", tag, step)
    if partial:
        plan = yield from _membership(
            site, plan, state, tag, step, timeout, deadline, what, measured
        )
    elif measured and not plan.direct(array.nbytes):
        plan = yield from _announced(site, plan, state, tag, step, deadline, what)
    run = _allreduce_run(site, plan, state, choose, tag, array, op, codec, critical)
    yield from drive_steps(run, step, deadline, what, site)
    if partial:
        return PartialResult(run.result(), plan.sites)
    return run.result()


def _membership(
    site: str,
    plan: Plan,
    state: CollectiveState,
    tag: str,
    step: int,
    timeout: float,
    deadline: Deadline,
    what: str,
    measured: bool,
) -> Generator[Step, Any, Plan]:
    member = Membership(site=site, plan=plan, tag=tag)
    yield from send_all(member.start(), step, best_effort=True)
    for source in (yield from collect_joins(member.joins_wanted(), step, Deadline(timeout / 2))):
        member.joined(source)
    if len(member.present) < 2 and member.peers:
        raise timeout_error(what, site, timeout, list(member.peers))
    reports = Reports(site, plan, tag)
    if member.leader != site:
        if measured:
            yield from send_all(reports.report(member.leader, (yield PathRows())), step)
        word = yield RecvOne(Expected(member.leader, member.plan_tag), step, deadline.left())
        if word is None:
            raise _no_plan(what, site, member.leader, timeout)
        return member.accept(member.leader, word)
    if measured:
        member.plan = yield from _measure(reports, state, plan)
    agreed, messages = member.decide()
    yield from send_all(messages, step)
    return agreed


def _announced(
    site: str,
    plan: Plan,
    state: CollectiveState,
    tag: str,
    step: int,
    deadline: Deadline,
    what: str,
) -> Generator[Step, Any, Plan]:
    """Shares by measured capacity: the lowest-named site announces them for this call."""
    reports = Reports(site, plan, tag)
    leader = plan.sites[0]
    if site == leader:
        measured = yield from _measure(reports, state, plan)
        yield from send_all(reports.announce(measured), step)
        return measured
    yield from send_all(reports.report(leader, (yield PathRows())), step)
    word = yield RecvOne(Expected(leader, reports.plan_tag), step, deadline.left())
    if word is None:
        raise _no_plan(what, site, leader, deadline.timeout_s)
    return reports.accept(leader, word)


def _measure(reports: Reports, state: CollectiveState, plan: Plan) -> Generator[Step, Any, Plan]:
    """The leader's plan: its own capacity now, the others' from their latest reports
    (drained without waiting: a report still on its way counts at the next call)."""
    for peer in reports.peers:
        while True:
            word = yield RecvOne(Expected(peer, reports.report_tag), None, 0.0)
            if word is None:
                break
            state.rates_mbps[peer] = reports.read_report(peer, word)
    state.rates_mbps[reports.site] = out_rates_mbps((yield PathRows()), reports.peers)
    return reports.plan_from_rates(state.rates_mbps)


def _no_plan(what: str, site: str, leader: str, timeout: float) -> CollectiveTimeout:
    return CollectiveTimeout(
        f"{what} at {site} timed out after {timeout:g} s: no plan from {leader}, the "
        f"lowest-named site present (it heard from other sites than {site} did, or left "
        f"{site} out as late); {site} joins again at a later step",
        (leader,),
        {},
    )


def broadcast_script(
    site: str,
    settings: Mapping[str, Any],
    tag: str,
    array: np.ndarray | None,
    *,
    root: str,
    step: int,
    timeout: float,
    sites: Iterable[str] | None,
) -> Script[np.ndarray]:
    _check_common(tag, step, timeout)
    plan = call_sites(site, settings, sites)
    run = BroadcastRun(
        site=site, sites=plan.sites, tag=tag, root=root, array=array, chunk_bytes=plan.chunk_bytes
    )
    yield Claim(f"broadcast/{tag}", step)
    yield from drive_steps(run, step, Deadline(timeout), _what("broadcast", tag, step), site)
    return run.result()


def barrier_script(
    site: str,
    settings: Mapping[str, Any],
    tag: str,
    *,
    step: int,
    timeout: float,
    sites: Iterable[str] | None,
) -> Script[None]:
    _check_common(tag, step, timeout)
    plan = call_sites(site, settings, sites)
    run = BarrierRun(site=site, sites=plan.sites, tag=tag)
    yield Claim(f"barrier/{tag}", step)
    yield from drive_steps(run, step, Deadline(timeout), _what("barrier", tag, step), site)
