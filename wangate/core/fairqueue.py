"""Sharing one peer's paths between jobs: weighted fair queueing over stripes of messages.

Each job (``wangate.core.jobs``) has two FIFOs of messages with work to send, critical
and bulk; a message back for repairs goes to the front of its job's FIFO. A path that
can send asks ``JobFairQueue.take`` for one piece of one class.

Start-time fair queueing (SFQ, Goyal et al., SIGCOMM 1996) per class, over stripes: every
job has a virtual start tag per class; the path picks the job it may carry whose tag is
smallest (ties: the job seen first), and that job keeps the turn on that path until it
has been served ``STRIPE_BYTES`` (256 KiB) or its message has nothing left to send. Each
byte served raises the job's tag by 1 / weight (``JobPolicy.weight``), so over stripes
the bytes served go in proportion to the weights, within one stripe per job; a datagram
costs a multiply-add and a counter decrement, a pick (a scan of the few jobs) happens
once a stripe. A job's tag is raised to the class's virtual time (the tag of the latest
pick) when it is picked: a job that was idle starts level with the others and hoards no
credit; while it is idle its share goes to the jobs that have work.

Critical before bulk, bounded. Critical messages of every job go before any bulk, but
one job's critical traffic must not starve another job's bulk. Clock-free rule: each
job has a *critical debt*. Serving job j's critical bytes while some other job has bulk
waiting adds those bytes to j's debt; serving any bulk bytes pays every job's debt down
by bytes x K, K = CRITICAL_SHARE / (1 - CRITICAL_SHARE) = 0.8 / 0.2 = 4. While j's debt
exceeds ``CRITICAL_BURST_BYTES`` (1 MiB) and another job's bulk waits, j's critical
messages lose strict priority: they are served in the bulk class at j's weight, ahead of
j's own bulk. So after a burst of 1 MiB, j's critical bytes C and the bulk bytes B served
meanwhile keep C - 4 B <= 1 MiB + two stripes (j's turn in the bulk class, where it may
lag a stripe behind): other jobs' bulk gets 20 % of the bytes, less those two stripes.
With no other job's bulk waiting, critical is unbounded (the debt does not grow).

Paths. A job whose ``JobPolicy.paths`` is a set is served only on those paths. Its
critical messages go on the critical route when it may use it, else on any path it may
use (``route`` below); with every path it may use down, its messages wait.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar

from wangate.core.jobs import DEFAULT_POLICIES, JobPolicy

STRIPE_BYTES: Final = 256 * 1024  # one turn of a job on a path
CRITICAL_SHARE: Final = (
    0.8  # of the bytes, at most, for one job's critical while others' bulk waits
)
CRITICAL_PAYBACK: Final = CRITICAL_SHARE / (1.0 - CRITICAL_SHARE)  # K: debt paid per bulk byte (4)
CRITICAL_BURST_BYTES: Final = 1 << 20  # critical debt allowed before the share applies
NO_POLICY: Final = JobPolicy()  # a job with no policy of its own
MIN_WEIGHT: Final = 1e-6  # a weight of 0 (or less) still gets served, last
BULK, CRITICAL = 0, 1  # the classes, as indexes


class FairQueued(Protocol):
    """What the queue needs of a message."""

    job: str
    critical: bool
    queued: bool

    @property
    def has_work(self) -> bool: ...


class FairServed(Protocol):
    """What the queue needs of a piece: what it charges."""

    @property
    def size_bytes(self) -> int: ...


M = TypeVar("M", bound=FairQueued)
P = TypeVar("P", bound=FairServed)
Helps = Callable[[frozenset[str] | None], bool]


@dataclass(frozen=True)
class JobSendStats:
    """One job's sending to one peer, as counted so far (``Sender.job_stats``)."""

    bytes_sent_by_path: dict[str, int] = field(default_factory=dict)  # data and repairs
    datagrams_sent_by_path: dict[str, int] = field(default_factory=dict)
    messages_started: int = 0  # admitted by credit, since the session began
    messages_in_flight: int = 0  # started, not yet confirmed done (or failed)
    held_bytes: int = 0  # bodies started and not yet taken by a trainer at the peer
    waiting_bytes: int = 0  # bodies waiting for credit (or for the job's cap)
    waiting_messages: int = 0
    critical_debt_bytes: int = 0


class _Job(Generic[M]):
    __slots__ = ("bulk", "critical", "debt_bytes", "inv_weight", "name", "order", "paths", "tags")

    def __init__(self, name: str, policy: JobPolicy, order: int) -> None:
        self.name = name
        self.order = order  # ties go to the job seen first
        self.critical: deque[M] = deque()
        self.bulk: deque[M] = deque()
        self.tags = [0.0, 0.0]  # virtual start tag per class (BULK, CRITICAL)
        self.debt_bytes = 0
        self.inv_weight = 1.0
        self.paths: frozenset[str] | None = None
        self.apply(policy)

    def apply(self, policy: JobPolicy) -> None:
        self.inv_weight = 1.0 / max(policy.weight, MIN_WEIGHT)
        self.paths = policy.paths

    def may_use(self, path: str | None) -> bool:
        paths = self.paths
        return path is None or paths is None or path in paths


class _Turn(Generic[M]):
    __slots__ = ("job", "left_bytes")

    def __init__(self, job: _Job[M]) -> None:
        self.job = job
        self.left_bytes = STRIPE_BYTES


class JobFairQueue(Generic[M]):
    """Messages with work to send, per job and class; ``take`` serves them fairly."""

    def __init__(self, policies: Mapping[str, JobPolicy] = DEFAULT_POLICIES) -> None:
        self._policies: Mapping[str, JobPolicy] = policies
        self.restricted = False  # some job may use only some paths
        self._jobs: dict[str, _Job[M]] = {}
        self._critical_jobs = 0  # jobs with a critical message queued
        self._bulk_jobs = 0  # jobs with a bulk message queued
        self._debtors: dict[str, _Job[M]] = {}  # jobs with critical debt
        self._vtime = [0.0, 0.0]  # per class: the start tag of the latest pick
        # per class, per path asking (None: any path): the job whose turn it is
        self._turns: tuple[dict[str | None, _Turn[M]], dict[str | None, _Turn[M]]] = ({}, {})
        self.set_policies(policies)

    def set_policies(self, policies: Mapping[str, JobPolicy]) -> None:
        """New weights, paths and caps; they apply to the messages queued too."""
        self._policies = policies
        self.restricted = any(p.paths is not None for p in policies.values())
        for name, job in self._jobs.items():
            job.apply(policies.get(name, NO_POLICY))

    def policy(self, job: str) -> JobPolicy:
        return self._policies.get(job, NO_POLICY)

    def allowed(self, job: str, path: str | None) -> bool:
        """Whether ``job``'s messages may go on ``path`` (None: any path)."""
        paths = self.policy(job).paths
        return path is None or paths is None or path in paths

    def push(self, message: M, *, front: bool) -> None:
        job = self._jobs.get(message.job)
        if job is None:
            job = _Job(message.job, self.policy(message.job), len(self._jobs))
            self._jobs[message.job] = job
        fifo = job.critical if message.critical else job.bulk
        if not fifo:
            if message.critical:
                self._critical_jobs += 1
            else:
                self._bulk_jobs += 1
        if front:
            fifo.appendleft(message)
        else:
            fifo.append(message)

    def clear(self) -> None:
        for job in self._jobs.values():
            job.critical.clear()
            job.bulk.clear()
            job.debt_bytes = 0
        self._critical_jobs = self._bulk_jobs = 0
        self._debtors.clear()
        for turns in self._turns:
            turns.clear()

    # ----------------------------------------------------------------- questions

    @property
    def has_work(self) -> bool:
        return self._critical_jobs > 0 or self._bulk_jobs > 0

    @property
    def has_bulk_work(self) -> bool:
        # a job's critical is demoted only while another job's bulk waits: counted here
        return self._bulk_jobs > 0

    @property
    def has_critical_work(self) -> bool:
        """Critical work with strict priority (some job's, not demoted by its debt)."""
        if not self._critical_jobs:
            return False
        if not self._debtors:
            return True
        return any(job.critical and not self._demoted(job) for job in self._jobs.values())

    def critical_for(self, path: str, route: str | None) -> bool:
        """Whether ``path`` would carry critical work now; ``route``: the critical route
        if it is usable, else None (then any path takes critical work)."""
        if not self.has_critical_work:
            return False
        if not self.restricted:
            return route is None or route == path
        return any(self._eligible(job, CRITICAL, path, route) for job in self._jobs.values())

    def messages(self, *, critical: bool) -> Iterator[M]:
        """Every queued message of a class, job by job."""
        for job in self._jobs.values():
            yield from job.critical if critical else job.bulk

    def debt_bytes(self, job: str) -> int:
        state = self._jobs.get(job)
        return 0 if state is None else state.debt_bytes

    def _demoted(self, job: _Job[M]) -> bool:
        """Its critical is served as bulk: debt past the burst, another job's bulk waits."""
        return job.debt_bytes > CRITICAL_BURST_BYTES and self._bulk_jobs > (1 if job.bulk else 0)

    def _eligible(self, job: _Job[M], cls: int, path: str | None, route: str | None) -> bool:
        paths = job.paths
        if paths is not None and path is not None and path not in paths:
            return False
        if cls == BULK:
            return bool(job.bulk) or (bool(job.critical) and self._demoted(job))
        if not job.critical or self._demoted(job):
            return False
        # the critical route takes it; any path it may use when it may not use the route
        return route is None or route == path or not job.may_use(route)

    # ----------------------------------------------------------------- serving

    def take(
        self,
        serve: Callable[[M, int], P | None],
        space: int,
        *,
        critical: bool,
        path: str | None = None,
        route: str | None = None,
        helps: Helps | None = None,
    ) -> P | None:
        """The next piece of the class for ``path``: ``serve(message, space)`` cuts it.
        ``helps(paths)``: whether ``path`` should carry bulk of a job that may use
        ``paths`` (None: all), asked once per job tried."""
        cls = CRITICAL if critical else BULK
        turns = self._turns[cls]
        turn = turns.get(path)
        if turn is not None:
            job = turn.job
            if self._eligible(job, cls, path, route) and (helps is None or helps(job.paths)):
                piece = self._serve(job, cls, serve, space, turn, path)
                if piece is not None:
                    return piece
            turns.pop(path, None)
        vtime = self._vtime[cls]
        candidates = [j for j in self._jobs.values() if self._eligible(j, cls, path, route)]
        if len(candidates) > 1:
            candidates.sort(key=lambda j: (max(j.tags[cls], vtime), j.order))
        for job in candidates:
            if helps is not None and not helps(job.paths):
                continue
            turn = _Turn(job)
            turns[path] = turn
            tag = job.tags[cls]
            job.tags[cls] = start = max(tag, vtime)  # an idle job starts level
            piece = self._serve(job, cls, serve, space, turn, path)
            if piece is not None:
                self._vtime[cls] = start
                return piece
            job.tags[cls] = tag
            turns.pop(path, None)
        return None

    def _serve(
        self,
        job: _Job[M],
        cls: int,
        serve: Callable[[M, int], P | None],
        space: int,
        turn: _Turn[M],
        path: str | None,
    ) -> P | None:
        if cls == CRITICAL:
            fifos: tuple[deque[M], ...] = (job.critical,)
        elif job.critical and self._demoted(job):
            fifos = (job.critical, job.bulk)  # its critical first, still
        else:
            fifos = (job.bulk,)
        for fifo in fifos:
            skipped = 0
            while skipped < len(fifo):
                message = fifo[skipped]
                piece = serve(message, space)
                has_work = message.has_work
                if not has_work:
                    del fifo[skipped]
                    message.queued = False
                    if not fifo:
                        if fifo is job.critical:
                            self._critical_jobs -= 1
                        else:
                            self._bulk_jobs -= 1
                elif piece is None:
                    # nothing of it fits this path (repair symbols cut for larger
                    # datagrams): leave it to the others
                    skipped += 1
                if piece is not None:
                    self._charge(job, cls, message.critical, piece.size_bytes, turn, path, has_work)
                    return piece
        return None

    def _charge(
        self,
        job: _Job[M],
        cls: int,
        critical: bool,
        size: int,
        turn: _Turn[M],
        path: str | None,
        has_work: bool,
    ) -> None:
        """A piece of ``size`` bytes was served: the job's tag, the critical debts, the
        turn."""
        job.tags[cls] += size * job.inv_weight
        if critical:
            if self._bulk_jobs > (1 if job.bulk else 0):  # another's bulk waits
                job.debt_bytes += size
                self._debtors[job.name] = job
        elif self._debtors:
            self._pay_debts(size)
        turn.left_bytes -= size
        if turn.left_bytes <= 0 or not has_work:
            self._turns[cls].pop(path, None)  # the stripe is served: pick again

    def served_next(self, message: M, path: str | None) -> bool:
        """Whether the next bulk ``take`` for ``path`` would serve ``message`` first, as it
        did the last: its job's turn there goes on, ``message`` heads the job's bulk, and
        no critical message of the job is served as bulk."""
        turn = self._turns[BULK].get(path)
        if turn is None:
            return False
        job = turn.job
        return (
            job.name == message.job
            and bool(job.bulk)
            and job.bulk[0] is message
            and not (job.critical and self._demoted(job))
            and job.may_use(path)
        )

    def charge_next(self, message: M, path: str | None, size: int) -> None:
        """``message`` was served ``size`` bytes as the next take would (``served_next``)."""
        turn = self._turns[BULK][path]
        job = turn.job
        has_work = message.has_work
        if not has_work:
            job.bulk.popleft()
            message.queued = False
            if not job.bulk:
                self._bulk_jobs -= 1
        self._charge(job, BULK, False, size, turn, path, has_work)

    def _pay_debts(self, bulk_bytes: int) -> None:
        paid = int(bulk_bytes * CRITICAL_PAYBACK)
        for name, debtor in list(self._debtors.items()):
            debtor.debt_bytes = max(0, debtor.debt_bytes - paid)
            if not debtor.debt_bytes:
                del self._debtors[name]
