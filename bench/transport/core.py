"""The sans-IO core's own cost per datagram: one process, no sockets, no engine.

    python -m bench transport core [--datagram 1452 8952] [--datagrams 40000] [--rounds 3]

Two ``PeerSession``s with one path each say hello over their control frames; the sender
is handed one message of about ``--datagrams`` datagrams, then the three steps each
datagram costs the daemons above the engine are timed apart: the sender pulling them
(``datagrams_to_send`` in batches of 64, what ``PeerDriver.fill`` asks for), the
receiver handling them (``handle_datagrams`` in batches of 64, one ``recvmmsg``'s
worth) and the sender taking the receiver's acks. Reported: microseconds per datagram,
the fastest of ``--rounds`` rounds (wall time of one thread that only does this, so the
fastest is the least disturbed by the machine's other work). What is left after these
is the engine (sealing, ``sendmmsg``, opening) and the event loop.
"""

from __future__ import annotations

import argparse
import time
import zlib

from wangate.core.events import MessageReceived
from wangate.core.frames import ControlStreamDecoder
from wangate.core.message import MessageHeader
from wangate.core.session import PeerSession

BATCH = 64
MiB = 1 << 20


def _pair(datagram_bytes: int, window_bytes: int) -> tuple[PeerSession, PeerSession]:
    def up(site: str, peer: str) -> PeerSession:
        session = PeerSession(
            site, peer, max_message_bytes=window_bytes, inbox_window_bytes=window_bytes, now=0
        )
        session.path_up("a", datagram_bytes=datagram_bytes, now=0.0)
        return session

    bj, sh = up("bj", "sh"), up("sh", "bj")
    for sender, receiver in ((bj, sh), (sh, bj)):
        for frame in ControlStreamDecoder().feed(sender.control_to_send("a", 0.0)):
            receiver.handle_control("a", frame, 0.0)
    return bj, sh


def one_round(datagram_bytes: int, datagrams: int) -> tuple[float, float, float]:
    """Microseconds per datagram: pulled, handled, acked."""
    size = datagrams * (datagram_bytes - 64)
    window = max(size + MiB, 8 * MiB)
    bj, sh = _pair(datagram_bytes, window)
    payload = bytes(size)
    msg_id = bj.submit(MessageHeader("core", 0, False, zlib.crc32(payload), b""), payload, 0.0)
    sent: list[bytes] = []
    started = time.perf_counter()
    while batch := bj.datagrams_to_send("a", 0.001, BATCH):
        sent += batch
    pulled = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(0, len(sent), BATCH):
        sh.handle_datagrams("a", sent[i : i + BATCH], 0.002)
    handled = time.perf_counter() - started
    arrived = [e for e in iter(sh.next_event, None) if isinstance(e, MessageReceived)]
    if [(e.msg_id, e.body_bytes >= size) for e in arrived] != [(msg_id, True)]:
        raise RuntimeError(f"the message did not arrive whole: {arrived!r}")
    frames = list(ControlStreamDecoder().feed(sh.control_to_send("a", 0.003)))
    started = time.perf_counter()
    for frame in frames:
        bj.handle_control("a", frame, 0.003)
    acked = time.perf_counter() - started
    count = max(len(sent), 1)
    return pulled / count * 1e6, handled / count * 1e6, acked / count * 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench transport core",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--datagram", type=int, nargs="+", default=[1452, 8952])
    parser.add_argument("--datagrams", type=int, default=40_000, help="per round (40000)")
    parser.add_argument("--rounds", type=int, default=3, help="the fastest is reported (3)")
    args = parser.parse_args(argv)
    if args.datagrams < BATCH or args.rounds < 1:
        parser.error(f"--datagrams at least {BATCH}, --rounds at least 1")
    print("| datagram | pulled (sender), us | handled (receiver), us | acked (sender), us |")
    print("|---|---|---|---|")
    for datagram_bytes in args.datagram:
        rounds = [one_round(datagram_bytes, args.datagrams) for _ in range(args.rounds)]
        best = [min(r[i] for r in rounds) for i in range(3)]
        print(f"| {datagram_bytes} | {best[0]:.2f} | {best[1]:.2f} | {best[2]:.2f} |")
    return 0
