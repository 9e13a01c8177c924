"""Broadcast and barrier as sans-IO runs (same driver interface as ``AllreduceRun``)."""

from __future__ import annotations

import numpy as np

from wangate.errors import LocalProtocolError

from .exchange import Arrivals, CollectiveMismatch, Expected, Outgoing
from .plan import DEFAULT_CHUNK_BYTES, Plan
from .tags import check_collective_tag, wire_tag

_TOKEN = np.zeros(1, dtype=np.uint8)
MAX_NDIM = 64


class BarrierRun:
    """Every site sends a token to every other; done when all tokens arrived."""

    def __init__(self, *, site: str, sites: tuple[str, ...], tag: str) -> None:
        check_collective_tag(tag)
        plan = Plan.equal(sites)
        if site not in plan.sites:
            raise LocalProtocolError(f"this site {site!r} is not among {list(plan.sites)}")
        self.site, self.tag = site, tag
        self.peers = tuple(s for s in plan.sites if s != site)
        self._wire = wire_tag("br", plan.digest, 0, tag)
        self._wanted = {p: Expected(p, self._wire) for p in self.peers}
        self.arrivals = Arrivals(self.peers)
        self._started = False

    @property
    def done(self) -> bool:
        return self._started and not self._wanted

    def wanted(self) -> list[Expected]:
        return list(self._wanted.values())

    def start(self) -> list[Outgoing]:
        self._started = True
        return [Outgoing.small(self.peers, self._wire, _TOKEN, True)] if self.peers else []

    def receive(self, source: str, tag: str, array: np.ndarray) -> list[Outgoing]:
        if self._wanted.pop(source, None) is None or tag != self._wire:
            raise LocalProtocolError(f"{tag!r} from {source!r} was not expected")
        self.arrivals.note(source)
        return []


class BroadcastRun:
    """The root sends a header (element count, chunk size, shape) then the chunks."""

    def __init__(
        self,
        *,
        site: str,
        sites: tuple[str, ...],
        tag: str,
        root: str,
        array: np.ndarray | None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        check_collective_tag(tag)
        plan = Plan.equal(sites)
        for name, what in ((site, "this site"), (root, "root")):
            if name not in plan.sites:
                raise LocalProtocolError(f"{what} {name!r} is not among {list(plan.sites)}")
        if site == root and array is None:
            raise LocalProtocolError(f"broadcast {tag!r}: the root {root} must pass an array")
        self.site, self.tag, self.root = site, tag, root
        self.peers = tuple(s for s in plan.sites if s != site)
        self._given = None if array is None else np.asarray(array)
        self._digest = plan.digest
        self._chunk_bytes = chunk_bytes
        self._wanted: dict[str, Expected] = {}
        self._result: np.ndarray | None = None
        self._shape: tuple[int, ...] = ()
        self._chunk_elems = 0
        self._count = 0
        self._filled = 0
        self.arrivals = Arrivals((root,) if site != root else ())
        self._started = False

    @property
    def done(self) -> bool:
        return self._started and not self._wanted

    def wanted(self) -> list[Expected]:
        return list(self._wanted.values())

    def result(self) -> np.ndarray:
        if not self.done:
            raise LocalProtocolError("the broadcast has not completed")
        if self.site == self.root:
            assert self._given is not None
            return self._given
        assert self._result is not None
        return self._result.reshape(self._shape)

    def start(self) -> list[Outgoing]:
        self._started = True
        if self.site != self.root:
            self._want(0)
            return []
        assert self._given is not None
        flat = np.ascontiguousarray(self._given).reshape(-1)
        per = max(1, self._chunk_bytes // max(1, flat.dtype.itemsize))
        header = np.array([flat.size, per, self._given.ndim, *self._given.shape], np.int64)
        out = [Outgoing.small(self.peers, self._tag(0), header, False)]
        for i, start in enumerate(range(0, max(1, flat.size), per)):
            out.append(
                Outgoing.small(self.peers, self._tag(i + 1), flat[start : start + per], False)
            )
        return out if self.peers else []

    def receive(self, source: str, tag: str, array: np.ndarray) -> list[Outgoing]:
        expected = self._wanted.pop(tag, None)
        if expected is None or source != self.root:
            raise LocalProtocolError(f"{tag!r} from {source!r} was not expected")
        self.arrivals.note(source)
        if self._chunk_elems == 0:
            self._header(array)
            return []
        flat = array.reshape(-1)
        if self._result is None:  # the first chunk gives the dtype
            self._result = np.empty(self._count, dtype=array.dtype)
        end = self._filled + flat.size
        if array.dtype != self._result.dtype or end > self._result.size:
            raise CollectiveMismatch(f"broadcast {self.tag!r}: malformed chunk from {source}")
        self._result[self._filled : end] = flat
        self._filled = end
        if not self._wanted and self._filled != self._result.size:
            raise CollectiveMismatch(f"broadcast {self.tag!r}: {source} sent too few elements")
        if not self._wanted:
            self._check_given()
        return []

    def _header(self, header: np.ndarray) -> None:
        values = [int(v) for v in header.reshape(-1)] if header.dtype == np.int64 else []
        bad = CollectiveMismatch(f"broadcast {self.tag!r}: malformed header from {self.root}")
        if len(values) < 3 or not 0 <= values[2] <= MAX_NDIM or len(values) != 3 + values[2]:
            raise bad
        count, per, _, *shape = values
        if per < 1 or count < 0 or any(d < 0 for d in shape) or int(np.prod(shape)) != count:
            raise bad
        self._shape = tuple(shape)
        self._count = count
        self._chunk_elems = per
        for i in range(max(1, -(-count // per))):
            self._want(i + 1)

    def _check_given(self) -> None:
        given, result = self._given, self._result
        assert result is not None
        if given is not None and (given.shape != self._shape or given.dtype != result.dtype):
            raise CollectiveMismatch(
                f"broadcast {self.tag!r}: {self.root} sent a {result.dtype} tensor of shape "
                f"{self._shape}, this site passed {given.dtype} of shape {given.shape}"
            )

    def _want(self, index: int) -> None:
        tag = self._tag(index)
        self._wanted[tag] = Expected(self.root, tag)

    def _tag(self, index: int) -> str:
        return wire_tag("bc", self._digest, index, self.tag)
