"""A run of one message's shards handed to the engine as one ``ShardSpan``.

The engine frames a span's datagrams (``encode_shard_span``, ``PathChannel.queue_many``)
exactly as ``encode_shard`` frames each one: checked byte for byte. The sender's span
path (``Sender._stripe``) is checked against the same session pulled one datagram at a
time (``datagram_to_send``, the reference): over seeded runs with several paths, jobs,
FEC, critical messages, a bulk governor, losses and acks, both give the same datagrams
and are left in the same state after every pull.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_session_reads import fingerprint
from wangate.core.datagrams import ShardSpan, encode_shard
from wangate.core.frames import ControlStreamDecoder
from wangate.core.governor import BulkGovernor
from wangate.core.jobs import JobPolicy
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.session import PeerSession
from wangate.engine._engine import encode_shard_span
from wangate.errors import LocalProtocolError


def span(**kw: Any) -> ShardSpan:
    fields: dict[str, Any] = {
        "payload": bytes(range(256)) * 64,
        "payload_base": 40,
        "seq_first": 9,
        "stamp": 0x123456,
        "msg_id": 3,
        "msg_len": 40 + 256 * 64,
        "start": 40,
        "end": 40 + 5000,
        "stride": 1200,
        "critical": False,
    }
    fields.update(kw)
    return ShardSpan(**fields)


def expected(s: ShardSpan) -> list[bytes]:
    """What ``encode_shard`` makes of each of the span's datagrams."""
    data = memoryview(s.payload)
    out = []
    for i, offset in enumerate(range(s.start, s.end, s.stride)):
        end = min(offset + s.stride, s.end)
        piece = data[offset - s.payload_base : end - s.payload_base]
        out.append(
            encode_shard(s.seq_first + i, s.stamp, s.msg_id, s.msg_len, offset, piece, s.critical)
        )
    return out


def test_a_span_is_framed_as_encode_shard_frames_each_datagram() -> None:
    s = span()
    datagrams = encode_shard_span(s)
    assert s.datagrams == 5 and [len(d) for d in datagrams] == [1220] * 4 + [220]
    assert datagrams == expected(s)
    # the usual header: type, seq 9, stamp, msg_id 3, msg_len and offset as 4-byte varints
    assert datagrams[1][:20] == bytes.fromhex("40 0000000a 123456 00000003 80004028 800004d8")
    assert datagrams[1][20:] == s.payload[1200:2400]


@settings(max_examples=300, deadline=None)
@given(
    msg_len=st.sampled_from([1, 63, 64, 16383, 16384, 1 << 20, (1 << 30) - 1, 1 << 30, 1 << 40]),
    data=st.data(),
    seq_first=st.integers(0, (1 << 64) - 1),
    msg_id=st.integers(0, (1 << 64) - 1),
    stamp=st.integers(0, (1 << 24) - 1),
    critical=st.booleans(),
)
def test_any_span_matches_encode_shard(
    msg_len: int, data: Any, seq_first: int, msg_id: int, stamp: int, critical: bool
) -> None:
    # a window of the message: the payload holds [base, base + len(payload))
    base = data.draw(st.integers(0, msg_len - 1))
    room = min(msg_len - base, 20000)
    # seeded bytes: drawing up to 20 KB would exceed hypothesis's entropy per example
    payload = random.Random(data.draw(st.integers(0, 2**32))).randbytes(room)
    start = data.draw(st.integers(base, base + room - 1))
    end = data.draw(st.integers(start + 1, base + room))
    stride = data.draw(st.integers(1, 3000))
    s = ShardSpan(payload, base, seq_first, stamp, msg_id, msg_len, start, end, stride, critical)
    if s.datagrams > 4096:
        with pytest.raises(LocalProtocolError, match="too many"):
            encode_shard_span(s)
        return
    if seq_first + s.datagrams > 1 << 64:
        with pytest.raises(LocalProtocolError, match="sequence numbers pass"):
            encode_shard_span(s)
        return
    assert encode_shard_span(s) == expected(s)


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"stride": 0}, LocalProtocolError, "needs a stride"),
        ({"end": 40}, LocalProtocolError, "needs a stride and at least one byte"),
        ({"msg_len": 4000}, LocalProtocolError, "past the end of its message"),
        ({"msg_len": 1 << 62}, LocalProtocolError, "past the end of its message"),
        ({"start": 39}, LocalProtocolError, "outside its payload"),
        ({"end": 40 + 256 * 64 + 1, "msg_len": 1 << 20}, LocalProtocolError, "outside"),
        ({"stamp": 1 << 24}, LocalProtocolError, "24 bits"),
        ({"seq_first": -1}, LocalProtocolError, "seq_first -1 is not a 64-bit"),
        ({"msg_id": 1 << 64}, LocalProtocolError, "msg_id"),
        ({"stride": 1, "end": 40 + 5000}, LocalProtocolError, "too many"),
        ({"seq_first": (1 << 64) - 4}, LocalProtocolError, "pass 2..64"),
        ({"stride": (1 << 20) + 1}, LocalProtocolError, "too large"),
        ({"start": 40.0}, TypeError, "ShardSpan.start must be an int"),
        ({"payload": 7}, TypeError, "bytes-like"),
    ],
)
def test_a_span_that_is_not_one_is_refused(
    fields: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        encode_shard_span(span(**fields))


def test_only_a_span_tuple_is_a_span() -> None:
    with pytest.raises(TypeError, match="ShardSpan of 10 items"):
        encode_shard_span((1, 2, 3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ShardSpan of 10 items"):
        encode_shard_span([*span()])  # type: ignore[arg-type]


# ----------------------------------------------------------- the sender's spans


PATHS = {"a": 1452, "b": 1200, "c": 1300}


def _pair(coding: CodingPolicy, paths: dict[str, int], governed: bool) -> tuple[Any, Any]:
    def up(site: str, peer: str) -> PeerSession:
        kw: dict[str, Any] = {"coding": coding}
        if governed and site == "bj":
            kw["governor"] = BulkGovernor(target_delay_s=0.0, interval_s=0.01)
        session = PeerSession(
            site, peer, max_message_bytes=1 << 22, inbox_window_bytes=1 << 24, now=0, **kw
        )
        for name, size in paths.items():
            session.path_up(name, datagram_bytes=size, now=0.0)
        return session

    sender, receiver = up("bj", "sh"), up("sh", "bj")
    for one, other in ((sender, receiver), (receiver, sender)):
        for name in paths:
            for frame in ControlStreamDecoder().feed(one.control_to_send(name, 0.0)):
                other.handle_control(name, frame, 0.0)
    return sender, receiver


def _one_at_a_time(session: Any, path: str, now: float, limit: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < limit and (datagram := session.datagram_to_send(path, now)) is not None:
        out.append(datagram)
    return out


def _deliver(
    sender: Any, receiver: Any, path: str, batch: list[bytes], now: float, rng: random.Random
) -> None:
    """``batch`` to ``receiver``, a seeded twentieth lost, sometimes reordered; its acks
    and other control frames back."""
    kept = [d for d in batch if rng.random() >= 0.05]
    if rng.random() < 0.2:
        rng.shuffle(kept)
    receiver.handle_datagrams(path, kept, now)
    list(iter(receiver.next_event, None))
    for name in PATHS:
        if name in receiver.path_names:
            for frame in ControlStreamDecoder().feed(receiver.control_to_send(name, now)):
                sender.handle_control(name, frame, now)


@pytest.mark.parametrize("seed", range(6))
def test_spans_send_what_one_datagram_at_a_time_sends(seed: int) -> None:
    rng = random.Random(seed)
    coding = [CodingPolicy(k=0), CodingPolicy(), CodingPolicy(k=4, min_repair=1)][seed % 3]
    paths = dict(list(PATHS.items())[: 1 + seed % 3])
    governed = seed % 4 == 3
    pairs = [_pair(coding, paths, governed) for _ in range(2)]
    jobs = {"j1": JobPolicy(weight=1.0), "j2": JobPolicy(weight=3.0)}
    for sender, _ in pairs:
        sender.set_jobs(jobs, 0.0)
    now, spans, datagrams = 0.0, 0, 0
    for step in range(250):
        now += rng.choice([1e-5, 1e-4, 2e-3])
        if step % 25 == 0:
            for _ in range(rng.randint(1, 3)):
                size = rng.choice([50, 3000, 40000, 300_000])
                payload = rng.randbytes(size)
                critical, job = rng.random() < 0.15, rng.choice(["j1", "j2"])
                header = MessageHeader("t", step, critical, zlib.crc32(payload), b"", job)
                for sender, _ in pairs:
                    sender.submit(header, payload, now)
        path = rng.choice(list(paths))
        limit = rng.choice([1, 2, 7, 64])
        (ref, _), (batched, _) = pairs
        want = _one_at_a_time(ref, path, now, limit)
        items = batched.send_batch(path, now, limit)
        spans += sum(not isinstance(i, bytes) for i in items)
        got = [d for i in items for d in ([i] if isinstance(i, bytes) else encode_shard_span(i))]
        assert got == want, f"step {step}"
        datagrams += len(got)
        assert fingerprint(batched) == fingerprint(ref), f"step {step}"
        for sender, receiver in pairs:
            _deliver(sender, receiver, path, got, now, random.Random(step))
            sender.handle_timer(now)
        assert fingerprint(batched) == fingerprint(ref), f"step {step}, after acks"
    assert spans > 10 and datagrams > 500  # the span path was taken, and carried much
