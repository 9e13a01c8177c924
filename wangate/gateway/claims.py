"""Who entered which collective at this site, so that two never blend.

A collective's messages are ordinary tagged messages (proto/collective.md): if two
trainers of one job at one site entered the same call (tag, step), their chunks would
meet in the other sites' reductions and each result would silently mix both. So a
trainer's client claims ``(kind/tag, step)`` in its job before it sends anything for the
call; a claim another open connection holds fails with ``collision``, naming the call,
the job and the process that holds it. A connection's claims end with it, and each job
remembers its last ``MAX_CLAIMS`` claims (older ones are forgotten, oldest first).
"""

from __future__ import annotations

from collections import OrderedDict

from wangate.errors import ErrorCode, GatewayError
from wangate.service import Claimant

MAX_CLAIMS = 65536  # per job


class CollectiveClaims:
    def __init__(self) -> None:
        self._held: dict[str, OrderedDict[tuple[str, int], Claimant]] = {}

    def claim(self, job: str, call: str, step: int, by: Claimant) -> None:
        """``by`` enters ``call`` (``kind/tag``) at ``step`` in ``job``; raises
        ``GatewayError`` (``collision``) if another open connection did."""
        held = self._held.setdefault(job, OrderedDict())
        key = (call, step)
        holder = held.get(key)
        if holder is not None and holder.connection != by.connection:
            kind, _, tag = call.partition("/")
            raise GatewayError(
                f"collision: {kind} {tag!r} at step {step} in job {job!r} "
                f"was entered at this site by another trainer (pid {holder.pid}); two "
                "trainers of one job at one site may not enter the same collective",
                code=ErrorCode.COLLISION,
            )
        held[key] = by
        held.move_to_end(key)
        while len(held) > MAX_CLAIMS:
            held.popitem(last=False)

    def release(self, connection: int) -> None:
        """A connection closed: its claims end."""
        for job, held in list(self._held.items()):
            for key in [k for k, c in held.items() if c.connection == connection]:
                del held[key]
            if not held:
                del self._held[job]

    def count(self, job: str) -> int:
        return len(self._held.get(job, ()))
