"""Allreduce as a sans-IO run: reduce-scatter then all-gather, or a direct exchange.

Reduce-scatter/all-gather: every site owns a contiguous share (``Plan.shares``), cut into
chunks. At start a site sends each other owner its slice of that owner's chunks. When an
owner holds a chunk from every site it reduces it (sorted site order) and sends the
result to everyone at once, so gathering starts with the first chunk, not after the last.
The owner keeps the decoded form of what it sent, so with a lossy codec every site still
holds the same bits. A plan with routes (``Plan.routes``) gathers a part's chunks through
a relay: the owner sends each reduced chunk to the sites its route names, and each of
those passes it on to the sites that get it through them, so a slow link between two
sites carries less of the all-gather (lossless calls only; with a lossy codec the owner
sends to all).

Direct exchange (two sites, or a tensor small enough that the second WAN crossing costs
more than the extra bytes, ``Plan.direct``): every site sends its whole tensor to every
other and reduces all of them itself in sorted site order; its own contribution enters
in the form the others decode, so every site computes the same bits.
"""

from __future__ import annotations

import numpy as np

from wangate.codec import EncodedTensor, decode_tensor, parse_spec
from wangate.errors import LocalProtocolError

from .arith import check_reducible, reduce_in_order
from .exchange import Arrivals, CollectiveMismatch, Expected, Outgoing
from .feedback import HopFeedback
from .plan import Plan, Route, Share, chunks
from .tags import check_collective_tag, wire_tag


class AllreduceRun:
    def __init__(
        self,
        *,
        site: str,
        plan: Plan,
        tag: str,
        array: np.ndarray,
        op: str = "sum",
        spec: str = "none",
        critical: bool = False,
        feedback: HopFeedback | None = None,
        divide_by: int | None = None,
    ) -> None:
        check_collective_tag(tag)
        if site not in plan.sites:
            raise LocalProtocolError(f"this site {site!r} is not among {list(plan.sites)}")
        array = np.asarray(array)
        check_reducible(array.dtype, op)
        self.site, self.plan, self.tag, self.op = site, plan, tag, op
        self.shape = array.shape
        self.dtype = array.dtype
        self._flat = np.ascontiguousarray(array).reshape(-1)
        self._spec = spec
        self._lossy = parse_spec(spec).lossy
        self._critical = critical
        self._feedback = feedback if feedback is not None else HopFeedback()
        self._count = divide_by if divide_by is not None else len(plan.sites)
        self._peers = tuple(s for s in plan.sites if s != site)
        n = self._flat.size
        self.direct = plan.direct(self._flat.nbytes)
        itemsize = self.dtype.itemsize
        # per chunk: the all-gather route (None: the owner sends to every peer)
        self._routes: list[Route | None] = []
        if self.direct:
            self._chunks = chunks(Share(site, 0, n), itemsize, plan.chunk_bytes)
            self._routes = [None] * len(self._chunks)
        else:
            self._chunks = []
            for share, route in plan.parts(n):
                cut = chunks(share, itemsize, plan.cut_bytes)
                self._chunks += cut
                # a relay could not pass a lossy encoding on unchanged: owners send to all
                self._routes += [None if self._lossy else route] * len(cut)
        self._result = np.empty(n, dtype=self.dtype)
        # chunk index -> contributions by site, until the chunk is reduced
        self._parts: dict[int, dict[str, np.ndarray]] = {}
        self._wanted: dict[str, Expected] = {}
        self._chunk_of: dict[str, int] = {}
        self.arrivals = Arrivals(self._peers)
        self._relays: set[str] = set()  # keys of _wanted this site passes on
        self._started = False

    # -- what the driver calls --------------------------------------------------------

    @property
    def peers(self) -> tuple[str, ...]:
        return self._peers

    @property
    def done(self) -> bool:
        return self._started and not self._wanted

    def wanted(self) -> list[Expected]:
        return list(self._wanted.values())

    def relayed(self) -> list[Expected]:
        """Of ``wanted``, the first reduced chunk from each site that this site passes on:
        a blocking driver looks for these between its waits, since a relay's children
        wait for them while it would otherwise still be taking contributions."""
        first: dict[str, Expected] = {}
        for key, want in self._wanted.items():
            if want.source not in first and key in self._relays:
                first[want.source] = want
        return list(first.values())

    def result(self) -> np.ndarray:
        if not self.done:
            raise LocalProtocolError("the allreduce has not completed")
        return self._result.reshape(self.shape)

    def start(self) -> list[Outgoing]:
        assert not self._started
        self._started = True
        out = []
        kind = "dx" if self.direct else "rs"
        hop = "dx" if self.direct else "rs"
        for index, chunk in enumerate(self._chunks):
            if self.direct:
                encoded = self._encode(self._flat[chunk.start : chunk.stop], hop, chunk)
                if self._peers:
                    out.append(self._outgoing(self._peers, kind, index, encoded))
                own = self._decoded_own(encoded, chunk)
                self._parts[index] = {self.site: own}
                for peer in self._peers:
                    self._expect(peer, kind, index)
            elif chunk.owner == self.site:
                self._parts[index] = {self.site: self._flat[chunk.start : chunk.stop]}
                for peer in self._peers:
                    self._expect(peer, "rs", index)
            else:
                encoded = self._encode(self._flat[chunk.start : chunk.stop], hop, chunk)
                out.append(self._outgoing((chunk.owner,), "rs", index, encoded))
                self._expect(self._gathered_from(index), "ag", index)
                route = self._routes[index]
                if route is not None and route.children(self.site, self.plan.sites):
                    self._relays.add(self._tag("ag", index) + "\0" + self._gathered_from(index))
        # contributions first: they depend on no one, so a driver waiting on them in
        # order never waits on a reduced chunk that itself waits on a missing site
        self._wanted = dict(sorted(self._wanted.items(), key=lambda kv: "/ag/" in kv[0]))
        # chunks complete already (no peers, or an owner's share with no one to wait for)
        for index in [i for i, parts in self._parts.items() if len(parts) == len(self.plan.sites)]:
            out.extend(self._reduce(index))
        return out

    def receive(self, source: str, tag: str, array: np.ndarray) -> list[Outgoing]:
        expected = self._wanted.pop(tag + "\0" + source, None)
        if expected is None:
            raise LocalProtocolError(f"{tag!r} from {source!r} was not expected")
        self.arrivals.note(source)
        index = self._chunk_of[tag]
        chunk = self._chunks[index]
        self._check(source, array, chunk, index)
        values = array.reshape(-1)
        if tag.startswith("@c/ag/"):
            self._result[chunk.start : chunk.stop] = values
            route = self._routes[index]
            children = route.children(self.site, self.plan.sites) if route else ()
            if not children:
                return []
            # a relay passes on the values it received, losslessly: every site then
            # holds the bits the owner's encoding decodes to
            return [Outgoing.small(children, tag, values, self._critical)]
        parts = self._parts[index]
        parts[source] = values
        if len(parts) == len(self.plan.sites):
            return self._reduce(index)
        return []

    # -- internals --------------------------------------------------------------------

    def _reduce(self, index: int) -> list[Outgoing]:
        chunk = self._chunks[index]
        parts = self._parts.pop(index)
        ordered = [parts[s] for s in self.plan.sites]
        reduced = reduce_in_order(ordered, self.op, self.dtype, self._count)
        if self.direct or not self._peers:
            self._result[chunk.start : chunk.stop] = reduced
            return []
        encoded = self._encode(reduced, "ag", chunk)
        self._result[chunk.start : chunk.stop] = self._decoded_own(encoded, chunk, reduced)
        route = self._routes[index]
        targets = route.children(self.site, self.plan.sites) if route else self._peers
        return [self._outgoing(targets, "ag", index, encoded)]

    def _gathered_from(self, index: int) -> str:
        """The site this one receives chunk ``index``'s reduced values from."""
        route = self._routes[index]
        if route is None:
            return self._chunks[index].owner
        return route.via[self.plan.sites.index(self.site)]

    def _encode(self, values: np.ndarray, hop: str, chunk: Share) -> EncodedTensor:
        return self._feedback.encode(
            self._spec, values, self.tag, hop, chunk.start, self._flat.size
        )

    def _decoded_own(
        self, encoded: EncodedTensor, chunk: Share, exact: np.ndarray | None = None
    ) -> np.ndarray:
        """What the peers will decode from ``encoded``: the exact values when lossless."""
        if not self._lossy:
            return exact if exact is not None else self._flat[chunk.start : chunk.stop]
        return decode_tensor(encoded.meta, encoded.payload).reshape(-1)

    def _outgoing(
        self, peers: tuple[str, ...], kind: str, index: int, encoded: EncodedTensor
    ) -> Outgoing:
        return Outgoing.of(peers, self._tag(kind, index), encoded, self._critical)

    def _tag(self, kind: str, index: int) -> str:
        return wire_tag(kind, self.plan.digest, index, self.tag)

    def _expect(self, source: str, kind: str, index: int) -> None:
        tag = self._tag(kind, index)
        self._chunk_of[tag] = index
        self._wanted[tag + "\0" + source] = Expected(source, tag)

    def _check(self, source: str, array: np.ndarray, chunk: Share, index: int) -> None:
        if array.dtype != self.dtype or array.size != chunk.size:
            raise CollectiveMismatch(
                f"allreduce {self.tag!r}: {source} sent {array.size} {array.dtype} elements "
                f"for chunk {index}, {self.site} expects {chunk.size} {self.dtype} "
                f"(a {self.dtype} tensor of shape {self.shape}): every site must pass a "
                "tensor of the same shape and dtype"
            )
