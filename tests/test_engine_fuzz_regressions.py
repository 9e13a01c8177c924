"""The engine's fuzz targets through its Python binding, in CI: the inputs the libFuzzer
targets (wangate/engine/fuzz/) and the atheris harnesses once failed on, kept in
``wangate/engine/fuzz/regressions/<target>/``, replayed here; the seed corpora of the
atheris targets; and arbitrary and mutated bytes, as in tests/test_fuzz_*.py.

An input of ``fuzz_packet`` goes through the binding as the C target takes it (its knob
byte, then length-prefixed packets, wangate/engine/fuzz/fuzz_packet.c): each packet is
opened against the largest packet number received so far, recorded in a ``Received``,
and the ACK owed is encoded and parsed back."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.strategies import mutated, seeds
from wangate.engine import _engine
from wangate.errors import RemoteProtocolError

REGRESSIONS = Path(__file__).resolve().parents[1] / "wangate" / "engine" / "fuzz" / "regressions"
FAST = settings(max_examples=200, deadline=None)
ENGINE = ["engine_frames", "engine_packet", "engine_listener", "engine_shards", "engine_spans"]


def regressions(target: str) -> list[Path]:
    folder = REGRESSIONS / target
    return sorted(folder.iterdir()) if folder.is_dir() else []


def replay_fuzz_packet(data: bytes) -> None:
    """fuzz_packet.c's steps, through the binding."""
    if not data:
        return
    suite = targets.ENGINE_SUITES[data[0] % 4 % 3]
    key = targets.engine_secret(suite)
    received = _engine.Received()
    off, now = 1, 1.0
    for _ in range(64):
        if len(data) - off < 2:
            break
        (head,) = struct.unpack_from(">H", data, off)
        packet = data[off + 2 : off + 2 + (head & 0x7FFF)]
        off += 2 + len(packet)
        now += 0.001
        try:
            _, pn, frames = _engine.open_short_packet(suite, key, packet, received.largest)
        except RemoteProtocolError:
            continue
        with contextlib.suppress(RemoteProtocolError):
            _engine.parse_frames(frames)
        if pn > targets.VARINT_MAX:
            continue
        new = received.is_new(pn)
        assert received.add(pn, True, now, 0.025) == new
        assert not received.is_new(pn)
        owed = received.ack(now)
        if owed is not None:
            ranges, delay = owed
            frame = _engine.encode_ack(ranges, delay)
            assert _engine.parse_frames(frame)["ack"] == {"ack_delay": delay, "ranges": ranges}


REPLAY = {
    "fuzz_frames": lambda data: targets.run("engine_frames", data),
    "fuzz_packet": replay_fuzz_packet,
    **{name: (lambda data, name=name: targets.run(name, data)) for name in ENGINE},
}


@pytest.mark.parametrize("target", sorted(REPLAY))
def test_regression_inputs(target: str) -> None:
    for path in regressions(target):
        REPLAY[target](path.read_bytes())


@pytest.mark.parametrize("target", ENGINE)
def test_every_seed_decodes(target: str) -> None:
    for seed in seeds(target):
        targets.TARGETS[target](seed)  # valid inputs: no error at all


@pytest.mark.parametrize("target", ENGINE)
@FAST
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_wangate_errors(target: str, data: bytes) -> None:
    targets.run(target, data)


@pytest.mark.parametrize("target", ENGINE)
@FAST
@given(data=st.data())
def test_mutated_seeds_decode_or_raise_wangate_errors(target: str, data: st.DataObject) -> None:
    targets.run(target, data.draw(mutated(seeds(target))))
