"""Carry out a generator of I/O steps: the one blocking/asyncio pair.

Logic that must run over both a blocking and an asyncio connection (the client's calls,
``wangate.client.protocol``; the collectives, ``wangate.collective``) is written once,
as a generator that yields what it needs done and is sent the outcome; a step that
fails has its exception thrown in, so the generator's own ``try`` blocks see it (a
segment lent for a send goes back however the send ends). ``run_steps`` does each step
with a function, ``run_steps_async`` with a coroutine function; nothing else differs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

S = TypeVar("S")
T = TypeVar("T")


def run_steps(steps: Generator[S, Any, T], do: Callable[[S], Any]) -> T:
    resume: Callable[[Any], S] = steps.send
    value: Any = None
    while True:
        try:
            step = resume(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            value, resume = do(step), steps.send
        except BaseException as exc:  # the generator decides; re-raised unless it catches
            value, resume = exc, steps.throw


async def run_steps_async(steps: Generator[S, Any, T], do: Callable[[S], Awaitable[Any]]) -> T:
    resume: Callable[[Any], S] = steps.send
    value: Any = None
    while True:
        try:
            step = resume(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            value, resume = await do(step), steps.send
        except BaseException as exc:  # the generator decides; re-raised unless it catches
            value, resume = exc, steps.throw
