"""Every deadline a peer's session keeps, by name, and its guard against late timers.

Part of ``PeerSession``: ``get_timer`` sets the named deadlines afresh from their
owners (the sender's, each path's, the peer's liveness, the reassembly's: they move
with every input, so all at once) and arms the earliest; ``handle_timer`` asks the
table first whether the timer fired late. The table owns what belongs to the timer
itself: when it was armed for, and the two holds a late timer leaves (below).

A timer that fires this late says our process was held up (a busy host): acks that
arrived meanwhile may still wait unread, and judging the paths now would declare lost
what they cover (each in-flight datagram past its timeout: a second of repairs for
nothing). The timer's work waits for one more turn of the driver's loop, which reads
the sockets first (no timer is armed sooner than 1 ms: uvloop polls before it fires):
the *recheck* hold. After a late timer the peer has a few of its best path's round
trips to answer what we send on waking before it can be judged unreachable: the
*answer-by* hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

LATE_TIMER_S: Final = 0.005
LATE_TIMER_RECHECK_S: Final = 0.001

# A deadline's name: one of the session's ("peer liveness"), or (kind, path) for a path's.
TimerName = str | tuple[str, str]


class TimerTable:
    """Named deadlines (the timer is the earliest) and the late-timer holds."""

    def __init__(self) -> None:
        self._at: dict[TimerName, float] = {}  # in the order each name was (re)added
        self.armed_at: float | None = None  # what ``arm`` last asked for
        self.recheck_at: float | None = None  # a late timer's work, after a read
        self.answer_by: float | None = None  # a late timer's judgement of the peer
        self.late_timers = 0  # timers that fired late enough to wait for a read first

    # ------------------------------------------------------------ deadlines

    def set(self, name: TimerName, at: float | None) -> None:
        """``name`` is due at ``at`` (replacing what it was; None: removed)."""
        if at is None:
            self._at.pop(name, None)
        else:
            self._at[name] = at

    def remove(self, name: TimerName) -> None:
        self._at.pop(name, None)

    def get(self, name: TimerName) -> float | None:
        return self._at.get(name)

    def names(self) -> list[TimerName]:
        return list(self._at)

    def earliest(self) -> float | None:
        """The earliest deadline (None: none)."""
        return min(self._at.values(), default=None)

    def due(self, now: float) -> list[TimerName]:
        """The names due at ``now``, earliest first; equal deadlines in the order their
        names were added (a replaced deadline keeps its name's place)."""
        order = {name: i for i, name in enumerate(self._at)}
        due = [name for name, at in self._at.items() if at <= now]
        return sorted(due, key=lambda name: (self._at[name], order[name]))

    # ------------------------------------------------------------ the timer

    def arm(self, deadlines: dict[TimerName, float] | None = None) -> float | None:
        """The time to arm the timer for: the earliest deadline, but nothing is judged
        before a late timer's read (the recheck hold). With ``deadlines``, they replace
        every deadline first (the table keeps the dict, in its order)."""
        if deadlines is not None:
            self._at = deadlines
        timer = min(self._at.values(), default=None)
        if timer is not None and self.recheck_at is not None:
            timer = max(timer, self.recheck_at)
        self.armed_at = timer
        return timer

    def defer_if_late(self, now: float, answer_wait_s: Callable[[], float]) -> bool:
        """Whether the timer firing at ``now`` is late and its work waits for a read
        (counted in ``late_timers``); ``answer_wait_s``: how long the peer then has to
        answer, if the answer-by hold is not already set."""
        late_s = 0.0 if self.armed_at is None else now - self.armed_at
        if self.recheck_at is None and late_s > LATE_TIMER_S:
            self.recheck_at = now + LATE_TIMER_RECHECK_S
            if self.answer_by is None:  # never extended: late timers may come in a row
                self.answer_by = now + answer_wait_s()
            self.late_timers += 1
            return True
        self.recheck_at = None
        return False

    def answer_due(self, now: float) -> bool:
        """Whether the timer may judge the peer at ``now`` (the answer-by hold passed,
        and is lifted)."""
        if self.answer_by is None or now >= self.answer_by:
            self.answer_by = None
            return True
        return False

    def not_before_answer(self, at: float) -> float:
        """``at``, or the answer-by hold if later: the peer's liveness deadline."""
        return at if self.answer_by is None else max(at, self.answer_by)

    def held_up(self, now: float) -> bool:
        """Whether the timer is overdue at ``now``, or fired late not long ago: then the
        process was held up and the peer's silence includes ours (a question: nothing
        changes)."""
        if self.recheck_at is not None:
            return True
        if self.answer_by is not None and now < self.answer_by:
            return True
        return self.armed_at is not None and now - self.armed_at > LATE_TIMER_S
