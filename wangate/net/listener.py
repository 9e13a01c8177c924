"""The UDP socket peer gateways dial: QUIC address validation and half-open caps.

aioquic's ``serve()`` builds a connection (TLS context, crypto, buffers: 55-70 KiB)
for every Initial of 1200 bytes, from any source, forged or not. This listener builds
one only for a client that has proved its address and only while
:class:`~wangate.core.admission.HandshakeAdmission` has room:

1. An Initial without a token is answered with a Retry (RFC 9000 §8.1.2) carrying an
   encrypted token bound to the client's address and connection IDs; nothing is kept.
   Forged sources never see the Retry, so they never get further.
2. An Initial with a token is checked (address, connection ID, age); a token that
   fails is dropped unanswered (RFC 9000 §8.1.3 allows it: the client times out and
   dials again; an INVALID_TOKEN close would cost a key derivation per forged packet).
   Retries and token checks share one budget of crypto work for unvalidated sources
   (see :class:`~wangate.core.admission.HandshakeAdmission`); beyond it, Initials are
   dropped after a look at a few header bytes.
3. A valid token admits a half-open connection within the caps; one that does not
   authenticate within the handshake timeout is closed and forgotten, and one the
   gateway refuses (a bad certificate) is forgotten as soon as its close is sent.
4. Once a path is authenticated, its data plane's packets (``wangate.engine``) are
   read with everyone else's in batches (``ListenerReader``: recvmmsg, UDP GRO) and
   opened in C by the path's own channel, routed there by their connection ID; the
   link gets its part of each batch in one call.
5. Anything else that matches no connection (short-header garbage, late packets of a
   forgotten connection, Initials under 1200 bytes, RFC 9000 §14.1) is dropped.

Retry costs a client one round trip more to connect; with ``retry=False`` step 1 and 2
are skipped (every Initial is admitted within the caps), for comparison only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection
from aioquic.quic.packet import (
    QuicErrorCode,
    QuicPacketType,
    QuicProtocolVersion,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)
from aioquic.quic.retry import QuicRetryTokenHandler

from wangate.core.admission import AdmissionLimits, HandshakeAdmission
from wangate.engine import CID_BYTES as DATA_PLANE_CID_BYTES
from wangate.engine import READ_BATCH_BUFFERS, ListenerReader, PathChannel
from wangate.net import aioquic_compat as compat
from wangate.net.address import host_port
from wangate.net.drain import MAX_DATAGRAMS_PER_TURN, DrainingTransport, open_draining_endpoint

log = logging.getLogger("wangate.listener")

MIN_INITIAL_CID_BYTES = 8  # a client's first Destination Connection ID (RFC 9000 §7.2)
REPORT_INTERVAL_S = 10.0  # at most one summary of dropped traffic per interval

CreateProtocol = Callable[[QuicConnection], QuicConnectionProtocol]
IsEstablished = Callable[[QuicConnectionProtocol], bool]


_INITIAL_TYPE_BITS = {
    QuicProtocolVersion.VERSION_1.to_bytes(4, "big"): 0x00,  # RFC 9000 §17.2.2
    QuicProtocolVersion.VERSION_2.to_bytes(4, "big"): 0x10,  # RFC 9369 §3.2
}


def _tokenless_initial(data: bytes) -> bool:
    """Whether a long-header datagram starts with an Initial without a token."""
    type_bits = _INITIAL_TYPE_BITS.get(data[1:5])
    if type_bits is None or data[0] & 0x30 != type_bits:
        return False
    token_at = 6 + data[5]
    if token_at >= len(data):
        return False
    token_at += 1 + data[token_at]
    return token_at < len(data) and data[token_at] == 0


def _ignore_cid(cid: bytes) -> None:
    pass


def _ignore() -> None:
    pass


def _unroute(protocol: QuicConnectionProtocol) -> None:
    """Stop a protocol telling the listener of its connection IDs and its end."""
    compat.route_connection_ids(
        protocol, issued=_ignore_cid, retired=_ignore_cid, terminated=_ignore
    )


class PeerListener(asyncio.DatagramProtocol):
    """Demultiplexes one UDP socket into QUIC connections, admitting them with care.

    ``create_protocol`` builds the protocol for a new connection; ``is_established``
    says when it has authenticated (from then on no cap applies to it).
    """

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        create_protocol: CreateProtocol,
        is_established: IsEstablished,
        limits: AdmissionLimits | None = None,
        retry: bool = True,
        name: str = "listener",
    ) -> None:
        self._configuration = configuration
        self._create_protocol = create_protocol
        self._is_established = is_established
        self._loop = asyncio.get_running_loop()
        self._retry = QuicRetryTokenHandler() if retry else None
        self.admission: HandshakeAdmission[QuicConnectionProtocol] = HandshakeAdmission(
            limits or AdmissionLimits(), self._loop.time()
        )
        self.name = name
        self._transport: asyncio.DatagramTransport | None = None
        # the accepted paths' data planes, by connection ID (on a DrainingTransport)
        self._reader: ListenerReader | None = None
        self._by_cid: dict[bytes, QuicConnectionProtocol] = {}
        self._cids: dict[QuicConnectionProtocol, set[bytes]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at: float | None = None
        # counters (cumulative), and what the last summary reported
        self.dropped = 0  # unparseable, unknown connection ID, short Initials
        self.retries_sent = 0
        self.invalid_tokens = 0
        self._reported: tuple[int, ...] = self._totals()
        self._report_at = self._loop.time() + REPORT_INTERVAL_S

    @property
    def connections(self) -> int:
        """Connections with state here, half-open and established."""
        return len(self._cids)

    @property
    def connection_ids(self) -> int:
        return len(self._by_cid)

    @property
    def transport(self) -> asyncio.DatagramTransport | None:
        return self._transport

    def close(self) -> None:
        """Close every connection and stop listening."""
        for protocol in list(self._cids):
            protocol.close()
            self._forget(protocol)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._transport is not None:
            self._transport.close()

    # ----------------------------------------------------------- datagrams

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)
        if isinstance(transport, DrainingTransport):
            self._reader = ListenerReader(transport.get_extra_info("socket").fileno())
            transport.reader = self._read_batches

    def _read_batches(self) -> None:
        """The socket is readable: read it down to empty (at most MAX_DATAGRAMS_PER_TURN
        packets), a batch per recvmmsg. Each authenticated path's data-plane packets are
        opened by its channel and handed to its link, one call per link and batch; the
        rest go through ``datagram_received`` one by one."""
        reader = self._reader
        assert reader is not None
        taken = 0
        while taken < MAX_DATAGRAMS_PER_TURN:
            try:
                groups, foreign, buffers, packets = reader.read(time.monotonic())
            except OSError as exc:  # an ICMP error reported on the socket
                self.error_received(exc)
                return
            taken += packets  # a coalesced buffer holds dozens, forged ones too
            for link, datagrams, errors in groups:
                link.data_plane_read(datagrams, errors)
            for data, addr in foreign:
                self.datagram_received(data, addr)
            if buffers < READ_BATCH_BUFFERS:
                return

    def datagram_received(self, data: bytes, addr: NetworkAddress) -> None:
        # The Destination Connection ID sits at a fixed offset (RFC 9000 §17.2, §17.3):
        # a known connection is found without parsing (it parses the packet itself),
        # and garbage costs one slice and one lookup.
        if len(data) < 7:
            self._drop()
            return
        if data[0] & 0x80:  # long header: the ID's length, then the ID
            protocol = self._by_cid.get(data[6 : 6 + data[5]])
        else:  # the data plane's packets first: nearly all of them are
            protocol = self._by_cid.get(data[1 : 1 + DATA_PLANE_CID_BYTES]) or self._by_cid.get(
                data[1 : 1 + self._configuration.connection_id_length]
            )
        if protocol is None:
            if not data[0] & 0x80 or len(data) < SMALLEST_MAX_DATAGRAM_SIZE:
                self._drop()  # no Initial (nor Version Negotiation) in a short datagram
                return
            if _tokenless_initial(data) and not self.admission.may_respond(
                str(addr[0]), self._loop.time(), peek=True
            ):
                return  # a Retry would be due, and none may be sent now: parse nothing
            protocol = self._accept(data, addr)
            if protocol is None:
                return
        protocol.datagram_received(data, addr)
        if self.admission.is_half_open(protocol):
            self._review(protocol)

    def _accept(self, data: bytes, addr: NetworkAddress) -> QuicConnectionProtocol | None:
        """A new connection for a first Initial, or None (answered statelessly or dropped)."""
        try:
            header = pull_quic_header(
                compat.Buffer(data=data), host_cid_length=self._configuration.connection_id_length
            )
        except ValueError:
            self._drop()
            return None
        version = header.version
        if version is not None and version not in self._configuration.supported_versions:
            if header.packet_type != QuicPacketType.VERSION_NEGOTIATION:
                self._version_negotiation(header, addr)  # never answer one with one
            else:
                self._drop()
            return None
        if header.packet_type != QuicPacketType.INITIAL:
            self._drop()
            return None
        now = self._loop.time()
        original_cid = header.destination_cid
        retry_source_cid: bytes | None = None
        if self._retry is not None:
            if not header.token:
                self._send_retry(header, addr, now)
                return None
            if not self.admission.may_respond(str(addr[0]), now):
                self._maybe_report(now)  # checking a token is crypto work too: same budget
                return None
            try:
                original_cid = self._retry.validate_token(
                    address=addr,
                    destination_cid=header.destination_cid,
                    token=header.token,
                    now=now,
                )
            except ValueError:
                self.invalid_tokens += 1
                self._maybe_report(now)
                return None
            retry_source_cid = header.destination_cid
        elif len(original_cid) < MIN_INITIAL_CID_BYTES:
            self._drop()
            return None
        source = str(addr[0])
        if self.admission.refusal(source) is not None:
            self._maybe_report(now)
            return None
        connection = QuicConnection(
            configuration=self._configuration,
            original_destination_connection_id=original_cid,
            retry_source_connection_id=retry_source_cid,
        )
        protocol = self._create_protocol(connection)
        protocol.connection_made(cast(asyncio.BaseTransport, self._transport))
        compat.route_connection_ids(
            protocol,
            issued=partial(self._cid_issued, protocol=protocol),
            retired=partial(self._cid_retired, protocol=protocol),
            terminated=partial(self._terminated, protocol=protocol),
        )
        self._cids[protocol] = set()
        self._cid_issued(header.destination_cid, protocol)
        self._cid_issued(connection.host_cid, protocol)
        self.admission.add(protocol, source, now)
        self._arm_expiry()
        return protocol

    def _send_retry(self, header: Any, addr: NetworkAddress, now: float) -> None:
        assert self._retry is not None
        if len(header.destination_cid) < MIN_INITIAL_CID_BYTES:
            self._drop()
            return
        if not self.admission.may_respond(str(addr[0]), now):
            self._maybe_report(now)
            return
        source_cid = os.urandom(8)
        token = self._retry.create_token(
            address=addr,
            original_destination_connection_id=header.destination_cid,
            retry_source_connection_id=source_cid,
            now=now,
        )
        packet = encode_quic_retry(
            version=header.version,
            source_cid=source_cid,
            destination_cid=header.source_cid,
            original_destination_cid=header.destination_cid,
            retry_token=token,
        )
        self._sendto(packet, addr)
        self.retries_sent += 1

    def _version_negotiation(self, header: Any, addr: NetworkAddress) -> None:
        if not self.admission.may_respond(str(addr[0]), self._loop.time()):
            return
        packet = encode_quic_version_negotiation(
            source_cid=header.destination_cid,
            destination_cid=header.source_cid,
            supported_versions=self._configuration.supported_versions,
        )
        self._sendto(packet, addr)

    def _sendto(self, packet: bytes, addr: NetworkAddress) -> None:
        if self._transport is not None:
            self._transport.sendto(packet, addr)

    def _drop(self) -> None:
        self.dropped += 1
        if self.dropped & 0x3FF == 0:  # a clock read per thousand is enough
            self._maybe_report(self._loop.time())

    # --------------------------------------------------- connection state

    def _review(self, protocol: QuicConnectionProtocol) -> None:
        """After a half-open connection handled a datagram: authenticated, or refused?"""
        if self._is_established(protocol):
            self.admission.established(protocol)
        elif compat.closing(compat.connection_of(protocol)):
            # refused (or failed) before authenticating: its close is on its way out
            # (sent by the protocol's own deferred transmit, if any), then nothing stays
            self.admission.closed(protocol)
            self._loop.call_soon(self._forget, protocol)

    def _arm_expiry(self) -> None:
        deadline = self.admission.get_timer()
        if deadline == self._expiry_at:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = deadline
        self._expiry = None if deadline is None else self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        self._expiry_at = None
        timeout_s = self.admission.limits.handshake_timeout_s
        for protocol in self.admission.expire(self._loop.time()):
            protocol.close(
                error_code=QuicErrorCode.CONNECTION_REFUSED,
                reason_phrase=f"handshake not completed within {timeout_s:g} s",
            )
            self._forget(protocol)
        self._arm_expiry()

    def _forget(self, protocol: QuicConnectionProtocol) -> None:
        """Drop every reference to a connection that will not authenticate."""
        for cid in self._cids.pop(protocol, ()):
            self._unroute_cid(cid)
        self.admission.closed(protocol)
        compat.stop_timer(protocol)  # its closing period: nothing more to send
        # break the protocol -> listener cycle so refcounting frees it right away
        _unroute(protocol)

    def _cid_issued(self, cid: bytes, protocol: QuicConnectionProtocol) -> None:
        cids = self._cids.get(protocol)
        if cids is not None:
            cids.add(cid)
            self._by_cid[cid] = protocol
            # a link routes its data plane's ID like any other (PathLink._open_channel):
            # from then on its channel opens its packets in the batch reads
            channel = getattr(protocol, "channel", None)
            if (
                self._reader is not None
                and isinstance(channel, PathChannel)
                and channel.recv_cid == cid
            ):
                self._reader.add(channel, protocol)

    def _cid_retired(self, cid: bytes, protocol: QuicConnectionProtocol) -> None:
        cids = self._cids.get(protocol)
        if cids is not None and cid in cids:
            cids.discard(cid)
            self._unroute_cid(cid)

    def _terminated(self, protocol: QuicConnectionProtocol) -> None:
        for cid in self._cids.pop(protocol, ()):
            self._unroute_cid(cid)
        self.admission.closed(protocol)
        _unroute(protocol)

    def _unroute_cid(self, cid: bytes) -> None:
        self._by_cid.pop(cid, None)
        if self._reader is not None:
            self._reader.remove(cid)

    # -------------------------------------------------------------- report

    def _totals(self) -> tuple[int, ...]:
        a = self.admission
        return (
            self.dropped,
            self.retries_sent,
            self.invalid_tokens,
            a.refused_total + a.refused_source,
            a.timed_out,
            a.responses_dropped,
        )

    def _maybe_report(self, now: float) -> None:
        if now < self._report_at:
            return
        self._report_at = now + REPORT_INTERVAL_S
        totals = self._totals()
        dropped, retries, invalid, refused, timed_out, unanswered = (
            t - r for t, r in zip(totals, self._reported, strict=True)
        )
        self._reported = totals
        if dropped + invalid + refused + timed_out + unanswered == 0:
            return
        log.warning(
            "%s: in the last %g s or so: %d Retry sent, %d Initials left unanswered (rate "
            "cap), %d invalid tokens, %d connections refused (half-open cap), %d handshakes "
            "timed out, %d datagrams matched no connection",
            self.name,
            REPORT_INTERVAL_S,
            retries,
            unanswered,
            invalid,
            refused,
            timed_out,
            dropped,
        )


async def listen_for_peers(
    host: str,
    port: int,
    *,
    configuration: QuicConfiguration,
    create_protocol: CreateProtocol,
    is_established: IsEstablished,
    limits: AdmissionLimits | None = None,
    retry: bool = True,
) -> PeerListener:
    """Bind ``host``:``port`` (UDP) and accept QUIC connections there."""
    name = host_port(host, port)

    def factory() -> PeerListener:
        return PeerListener(
            configuration=configuration,
            create_protocol=create_protocol,
            is_established=is_established,
            limits=limits,
            retry=retry,
            name=name,
        )

    # read down to empty on each turn: see wangate.net.drain
    _, listener = await open_draining_endpoint(factory, host, port)
    return listener


__all__ = ["AdmissionLimits", "PeerListener", "listen_for_peers"]
