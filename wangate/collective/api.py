"""The collectives behind ``Client`` and ``AsyncClient``: inputs checked, plan chosen, run driven.

The arithmetic runs here, in the trainer's process: the daemon's core stays with the
transport (bench/collective.py measures both placements' CPU cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from wangate.errors import LocalProtocolError

from .allreduce import AllreduceRun
from .driver import (
    AsyncTransport,
    Deadline,
    SyncTransport,
    collect_joins,
    collect_joins_async,
    drive,
    drive_async,
    send_all,
    send_all_async,
    timeout_error,
)
from .exchange import CollectiveTimeout
from .feedback import HopFeedback
from .membership import Membership
from .plan import DEFAULT_CHUNK_BYTES, DEFAULT_LATENCY_S, DEFAULT_RATE_BPS, Plan
from .small import BarrierRun, BroadcastRun

MAX_STEP = (1 << 63) - 1
ChooseSpec = Callable[[str, int, str | None, np.dtype[Any]], str]


@dataclass(frozen=True)
class PartialResult:
    """``allreduce(..., partial=True)``: the reduction over ``contributors`` (sorted)."""

    array: np.ndarray
    contributors: tuple[str, ...]


class CollectiveState:
    """Per-client state: error feedback per hop."""

    def __init__(self) -> None:
        self.feedback = HopFeedback()


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


def allreduce(
    gw: SyncTransport,
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
) -> np.ndarray | PartialResult:
    _check_common(tag, step, timeout)
    array = np.asarray(array)
    plan = call_sites(site, settings, sites)
    deadline = Deadline(timeout)
    what = _what("allreduce", tag, step)
    if not partial:
        run = _allreduce_run(site, plan, state, choose, tag, array, op, codec, critical)
        drive(gw, run, step, deadline, what, site)
        return run.result()
    AllreduceRun(site=site, plan=plan, tag=tag, array=array, op=op)  # checks inputs first
    member = Membership(site=site, plan=plan, tag=tag)
    send_all(gw, member.start(), step)
    for source in collect_joins(gw, member.joins_wanted(), step, Deadline(timeout / 2)):
        member.joined(source)
    if len(member.present) < 2 and member.peers:
        raise timeout_error(what, site, timeout, list(member.peers))
    if member.leader == site:
        agreed, messages = member.decide()
        send_all(gw, messages, step)
    else:
        try:
            word = gw.recv(
                member.plan_tag, source=member.leader, step=step, timeout=deadline.left()
            )
        except CollectiveTimeout:
            raise
        except Exception as exc:
            raise _no_plan(what, site, member.leader, timeout) from exc
        agreed = member.accept(member.leader, word)
    run = _allreduce_run(site, agreed, state, choose, tag, array, op, codec, critical)
    drive(gw, run, step, deadline, what, site)
    return PartialResult(run.result(), agreed.sites)


async def allreduce_async(
    gw: AsyncTransport,
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
) -> np.ndarray | PartialResult:
    _check_common(tag, step, timeout)
    array = np.asarray(array)
    plan = call_sites(site, settings, sites)
    deadline = Deadline(timeout)
    what = _what("allreduce", tag, step)
    if not partial:
        run = _allreduce_run(site, plan, state, choose, tag, array, op, codec, critical)
        await drive_async(gw, run, step, deadline, what, site)
        return run.result()
    AllreduceRun(site=site, plan=plan, tag=tag, array=array, op=op)
    member = Membership(site=site, plan=plan, tag=tag)
    await send_all_async(gw, member.start(), step)
    window = Deadline(timeout / 2)
    for source in await collect_joins_async(gw, member.joins_wanted(), step, window):
        member.joined(source)
    if len(member.present) < 2 and member.peers:
        raise timeout_error(what, site, timeout, list(member.peers))
    if member.leader == site:
        agreed, messages = member.decide()
        await send_all_async(gw, messages, step)
    else:
        try:
            word = await gw.recv(
                member.plan_tag, source=member.leader, step=step, timeout=deadline.left()
            )
        except Exception as exc:
            raise _no_plan(what, site, member.leader, timeout) from exc
        agreed = member.accept(member.leader, word)
    run = _allreduce_run(site, agreed, state, choose, tag, array, op, codec, critical)
    await drive_async(gw, run, step, deadline, what, site)
    return PartialResult(run.result(), agreed.sites)


def _no_plan(what: str, site: str, leader: str, timeout: float) -> CollectiveTimeout:
    return CollectiveTimeout(
        f"{what} at {site} timed out after {timeout:g} s: no plan from {leader}, the "
        f"lowest-named site present (it heard from other sites than {site} did, or left "
        f"{site} out as late); {site} joins again at a later step",
        (leader,),
        {},
    )


def broadcast(
    gw: SyncTransport,
    site: str,
    settings: Mapping[str, Any],
    state: CollectiveState,
    tag: str,
    array: np.ndarray | None,
    *,
    root: str,
    step: int,
    timeout: float,
    sites: Iterable[str] | None,
) -> np.ndarray:
    _check_common(tag, step, timeout)
    plan = call_sites(site, settings, sites)
    run = BroadcastRun(
        site=site, sites=plan.sites, tag=tag, root=root, array=array, chunk_bytes=plan.chunk_bytes
    )
    drive(gw, run, step, Deadline(timeout), _what("broadcast", tag, step), site)
    return run.result()


async def broadcast_async(
    gw: AsyncTransport,
    site: str,
    settings: Mapping[str, Any],
    state: CollectiveState,
    tag: str,
    array: np.ndarray | None,
    *,
    root: str,
    step: int,
    timeout: float,
    sites: Iterable[str] | None,
) -> np.ndarray:
    _check_common(tag, step, timeout)
    plan = call_sites(site, settings, sites)
    run = BroadcastRun(
        site=site, sites=plan.sites, tag=tag, root=root, array=array, chunk_bytes=plan.chunk_bytes
    )
    await drive_async(gw, run, step, Deadline(timeout), _what("broadcast", tag, step), site)
    return run.result()


def barrier(
    gw: SyncTransport,
    site: str,
    settings: Mapping[str, Any],
    tag: str,
    *,
    step: int,
    timeout: float,
    sites: Iterable[str] | None,
) -> None:
    _check_common(tag, step, timeout)
    plan = call_sites(site, settings, sites)
    run = BarrierRun(site=site, sites=plan.sites, tag=tag)
    drive(gw, run, step, Deadline(timeout), _what("barrier", tag, step), site)


async def barrier_async(
    gw: AsyncTransport,
    site: str,
    settings: Mapping[str, Any],
    tag: str,
    *,
    step: int,
    timeout: float,
    sites: Iterable[str] | None,
) -> None:
    _check_common(tag, step, timeout)
    plan = call_sites(site, settings, sites)
    run = BarrierRun(site=site, sites=plan.sites, tag=tag)
    await drive_async(gw, run, step, Deadline(timeout), _what("barrier", tag, step), site)
