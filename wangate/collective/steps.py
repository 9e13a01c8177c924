"""The steps of a collective, written once for both clients.

A script is a generator that yields what it needs done (send, one recv, the path table,
drive a run, collect joins) and gets the outcome back; ``run_sync`` and ``run_async``
carry the steps out with a blocking or an asyncio client.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from wangate.errors import RecvTimeout
from wangate.rows import PathRow

from .driver import (
    Deadline,
    Run,
    collect_joins,
    collect_joins_async,
    drive,
    drive_async,
    send_all,
    send_all_async,
)
from .exchange import Expected, Outgoing

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    messages: list[Outgoing]
    best_effort: bool = False  # a peer that cannot be reached is skipped (joins)


@dataclass(frozen=True)
class RecvOne:  # -> the array, or None when nothing came in ``timeout_s``
    want: Expected
    step: int | None
    timeout_s: float


@dataclass(frozen=True)
class PathRows:  # -> the gateway's ``paths()`` rows, as ``PathRow``s
    pass


@dataclass(frozen=True)
class DriveRun:  # -> None once the run is done; raises CollectiveTimeout
    run: Run
    deadline: Deadline
    what: str


@dataclass(frozen=True)
class Joins:  # -> the sources whose join arrived before the window closed
    wanted: list[Expected]
    window: Deadline


Step = Send | RecvOne | PathRows | DriveRun | Joins
Script = Generator[Step, Any, T]


def run_sync(gw: Any, site: str, step: int, script: Script[T]) -> T:
    result: Any = None
    while True:
        try:
            todo = script.send(result)
        except StopIteration as stop:
            return cast(T, stop.value)
        if isinstance(todo, Send):
            send_all(gw, todo.messages, step, todo.best_effort)
            result = None
        elif isinstance(todo, RecvOne):
            w = todo.want
            try:
                result = gw.recv(w.tag, source=w.source, step=todo.step, timeout=todo.timeout_s)
            except RecvTimeout:
                result = None
        elif isinstance(todo, PathRows):
            result = PathRow.from_dicts(gw.paths())
        elif isinstance(todo, DriveRun):
            drive(gw, todo.run, step, todo.deadline, todo.what, site)
            result = None
        else:
            result = collect_joins(gw, todo.wanted, step, todo.window)


async def run_async(gw: Any, site: str, step: int, script: Script[T]) -> T:
    result: Any = None
    while True:
        try:
            todo = script.send(result)
        except StopIteration as stop:
            return cast(T, stop.value)
        if isinstance(todo, Send):
            await send_all_async(gw, todo.messages, step, todo.best_effort)
            result = None
        elif isinstance(todo, RecvOne):
            w = todo.want
            try:
                result = await gw.recv(
                    w.tag, source=w.source, step=todo.step, timeout=todo.timeout_s
                )
            except RecvTimeout:
                result = None
        elif isinstance(todo, PathRows):
            result = PathRow.from_dicts(await gw.paths())
        elif isinstance(todo, DriveRun):
            await drive_async(gw, todo.run, step, todo.deadline, todo.what, site)
            result = None
        else:
            result = await collect_joins_async(gw, todo.wanted, step, todo.window)
