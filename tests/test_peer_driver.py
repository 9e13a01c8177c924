"""The shell in one process: two gateways, real QUIC/TLS on loopback, no subprocesses.

Each ``PeerDriver`` is driven by aioquic connections on 127.0.x.y, the way aioquic's
own ``tests/test_asyncio.py`` runs client and server in one loop: paths come up, go
down and reconnect; a redial from one site replaces its stale connection; a peer that
restarts fails what it held and its paths come back.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from wangate.config import load_config
from wangate.core.events import MessageReceived
from wangate.core.message import MessageHeader
from wangate.daemon import Gateway
from wangate.errors import GatewayError, LinkError, LocalProtocolError
from wangate.errors import MessageFailed as MessageFailedError
from wangate.loopback import PATH_NAMES, write_site_configs
from wangate.net.drain import DrainingTransport
from wangate.net.link import LinkState, PathLink
from wangate.net.peer_driver import PENDING_HIGH_WATER, PENDING_LOW_WATER, pending_low_water
from wangate.service import Delivery, Submission

pytestmark = pytest.mark.timeout(90)
A = PATH_NAMES[0]


async def poll(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def submission(peer: str, tag: str, payload: bytes, step: int = 0) -> Submission:
    return Submission(peer, tag, step, False, b"", payload, zlib.crc32(payload))


def link(gateway: Gateway, peer: str, path: str) -> PathLink | None:
    return gateway.peers[peer].links.get(path)


def both_up(bj: Gateway, sh: Gateway, path: str) -> bool:
    a, b = link(bj, "sh", path), link(sh, "bj", path)
    return a is not None and b is not None and a.state is b.state is LinkState.UP


async def pair(directory: Path, paths: int = 1, extra: str = "") -> tuple[Gateway, Gateway]:
    bj_site, sh_site = write_site_configs(directory, 2, paths, mtu=1500, extra_toml=extra)
    bj = Gateway(load_config(bj_site.config_path))
    sh = Gateway(load_config(sh_site.config_path))  # sh dials, bj answers
    await bj.start()
    await sh.start()
    for path in PATH_NAMES[:paths]:
        await poll(lambda path=path: both_up(bj, sh, path))  # type: ignore[misc]
    return bj, sh


async def exchange(sender: Gateway, receiver: Gateway, tag: str, payload: bytes) -> None:
    await sender.service.submit(submission(receiver.service.site_name, tag, payload))
    delivery = await receiver.service.receive(tag, sender.service.site_name, None, 10.0)
    assert bytes(delivery.payload) == payload


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


# ------------------------------------------------------------- paths


async def _up_down_reconnect(directory: Path) -> None:
    bj, sh = await pair(directory, paths=2)
    try:
        await exchange(sh, bj, "first", b"\x01\x02\x03" * 1000)
        old_sh, old_bj = link(sh, "bj", A), link(bj, "sh", A)
        sh.service.reset_path("bj", A)  # the operator's reset: both sides see the path go
        assert old_sh is not None and old_sh.state is LinkState.CLOSED
        assert old_sh.refused == "reset by operator"
        await poll(lambda: old_bj is not None and old_bj.state is LinkState.CLOSED)
        assert A not in bj.peers["sh"].links or link(bj, "sh", A) is not old_bj
        await poll(lambda: both_up(bj, sh, A))  # sh dials again
        new_sh, new_bj = link(sh, "bj", A), link(bj, "sh", A)
        assert new_sh is not old_sh and new_bj is not old_bj
        # connected both (a loaded machine may show a loopback path degraded, never down)
        assert [row.state != "down" for row in sh.service.paths()] == [True, True]
        await exchange(sh, bj, "after", bytes(range(256)) * 400)
        await exchange(bj, sh, "back", b"\xff" * 70_000)
    finally:
        await sh.close()
        await bj.close()


def test_a_path_goes_down_and_reconnects_with_data_intact(tmp_path: Path) -> None:
    run(_up_down_reconnect(tmp_path))


async def _shutdown_told(directory: Path) -> None:
    bj, sh = await pair(directory, paths=2)  # bj answers: its links use its listener
    try:
        dialed = [link(sh, "bj", path) for path in PATH_NAMES[:2]]
        await bj.close()
        # told by bj's CONNECTION_CLOSE, long before any silence or idle timeout
        await poll(lambda: all(d is not None and d.state is LinkState.CLOSED for d in dialed), 1.0)
        assert [d.refused for d in dialed if d is not None] == [None, None]
        assert sh.peers["bj"].links == {}
    finally:
        await sh.close()


def test_a_gateway_shutting_down_tells_its_peers_on_every_link(tmp_path: Path) -> None:
    run(_shutdown_told(tmp_path))


async def _stale_replaced(directory: Path) -> None:
    bj, sh = await pair(directory)
    try:
        stale_bj, old_sh = link(bj, "sh", A), link(sh, "bj", A)
        assert stale_bj is not None and old_sh is not None and old_sh._transport is not None
        # sh gives the connection up, and its close is lost on the way: bj still holds it
        old_sh._transport.sendto = lambda *args: None  # type: ignore[method-assign]
        old_sh.refuse(LinkError.RESET, "gone on this side")
        assert stale_bj.state is LinkState.UP
        # sh's redial replaces the stale connection at once, not when it idles out (10 s)
        await poll(lambda: stale_bj.state is LinkState.CLOSED, timeout_s=5.0)
        assert stale_bj.refused == f"path {A} reconnected"
        # its socket was the listener's: still read in batches, for the other links
        assert isinstance(stale_bj._transport, DrainingTransport)
        assert stale_bj._transport.reader is not None
        await poll(lambda: both_up(bj, sh, A), timeout_s=5.0)
        assert link(sh, "bj", A) is not old_sh
        await exchange(sh, bj, "after-redial", b"\x07" * 50_000)
    finally:
        await sh.close()
        await bj.close()


def test_a_redial_from_the_same_site_replaces_its_stale_connection(tmp_path: Path) -> None:
    run(_stale_replaced(tmp_path))


async def _restart(directory: Path) -> None:
    bj, sh = await pair(directory)
    config = bj.config
    try:
        msg_id = await sh.service.submit(submission("bj", "held", b"\x05" * 3000))
        await poll(lambda: sh.peers["bj"].view.message_state(msg_id) == "held")
        first_instance = bj.instance_id
        await bj.close()  # no trainer took "held": it is lost with this instance
        bj = Gateway(config)
        await bj.start()
        assert bj.instance_id != first_instance
        with pytest.raises(MessageFailedError, match="restarted with it in its inbox"):
            await sh.service.wait_message("bj", msg_id, 10.0)
        await poll(lambda: both_up(bj, sh, A))
        assert sh.peers["bj"].instance_id == bj.instance_id
        await exchange(sh, bj, "after-restart", b"\x09" * 20_000)
    finally:
        await sh.close()
        await bj.close()


def test_a_restarted_peer_fails_what_it_held_and_its_paths_come_back(tmp_path: Path) -> None:
    run(_restart(tmp_path))


async def _link_states(directory: Path) -> None:
    bj, sh = await pair(directory)
    try:
        live = link(sh, "bj", A)
        assert live is not None
        with pytest.raises(LocalProtocolError, match="up -> authenticated is not allowed"):
            live._move(LinkState.AUTHENTICATED)
        live.refuse(LinkError.SHUTDOWN, "test")
        with pytest.raises(LocalProtocolError, match="closed -> up is not allowed"):
            live._move(LinkState.UP)
    finally:
        await sh.close()
        await bj.close()


def test_a_link_moves_only_along_its_transition_table(tmp_path: Path) -> None:
    run(_link_states(tmp_path))


# ------------------------------------------------------------ submit


async def _at_the_limit(directory: Path) -> None:
    limits = "[limits]\nmax_message_bytes = 200000\nclient_budget_bytes = 1000000\n"
    bj, sh = await pair(directory, extra=limits)
    try:
        payload = bytes(range(256)) * 781 + b"\x00" * 64  # exactly 200 000 bytes
        assert len(payload) == sh.config.limits.max_message_bytes
        await exchange(sh, bj, "t" * 1024, payload)  # the longest tag, too
        with pytest.raises(GatewayError) as refused:
            await sh.service.submit(submission("bj", "x" * 1025, b"abc"))
        assert refused.value.code == "bad_request"  # the request, not the connection
        assert "tag must be 1..1024 bytes" in str(refused.value)
        await exchange(sh, bj, "still", b"\x01" * 10)
    finally:
        await sh.close()
        await bj.close()


def test_a_payload_at_the_limit_passes_and_a_bad_tag_fails_only_its_request(
    tmp_path: Path,
) -> None:
    run(_at_the_limit(tmp_path))


async def _send_fails_once(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bj, sh = await pair(directory)
    try:
        real = PathLink.send_now
        failures: list[str] = []

        def send_now_failing_once(self: PathLink) -> None:
            if not failures:
                failures.append("sent nothing")
                raise RuntimeError("a fault while sending")
            real(self)

        monkeypatch.setattr(PathLink, "send_now", send_now_failing_once)
        payload = b"\x5a" * 3000
        critical = Submission("bj", "urgent", 1, True, b"", payload, zlib.crc32(payload))
        message_id = await sh.service.submit(critical)  # accepted, not failed
        assert message_id >= 1 and failures == ["sent nothing"]
        delivery = await bj.service.receive("urgent", "sh", 1, 10.0)
        assert bytes(delivery.payload) == payload and delivery.critical
    finally:
        await sh.close()
        await bj.close()


def test_a_fault_sending_a_critical_message_at_once_leaves_it_queued_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run(_send_fails_once(tmp_path, monkeypatch))
    assert "sending to bj right away failed; the message stays queued" in caplog.text
    assert "RuntimeError: a fault while sending" in caplog.text


# ----------------------------------------------------------- delivery


async def _credit(directory: Path) -> None:
    _, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    sh = Gateway(load_config(sh_site.config_path))  # not started: no links needed
    session = sh.peers["bj"].view
    before = session.granted_bytes
    # a payload that is no view of its body: the credit is the body's size regardless
    payload = b"\x11" * 10
    sh.delivery.inbox.try_deliver(Delivery("bj", "t", 0, False, b"", payload, 0, 7, body_bytes=50))
    delivery = await sh.service.receive("t", "bj", None, 1.0)
    assert bytes(delivery.payload) == payload
    assert session.granted_bytes == before + 50
    await sh.close()


def test_credit_returns_the_body_bytes_the_session_counted(tmp_path: Path) -> None:
    run(_credit(directory=tmp_path))


def received(msg_id: int, size: int) -> MessageReceived:
    header = MessageHeader("t", msg_id, False, 0, b"")
    return MessageReceived(msg_id, header, memoryview(bytes([msg_id]) * size), size + 30)


async def _order(directory: Path) -> None:
    limits = "[limits]\nmax_message_bytes = 1000\npeer_inbox_bytes = 1000\n"
    limits += "client_budget_bytes = 1000\n"
    _, sh_site = write_site_configs(directory, 2, 1, mtu=1500, extra_toml=limits)
    sh = Gateway(load_config(sh_site.config_path))
    sh.delivery.received("bj", received(1, 600))  # queued
    sh.delivery.received("bj", received(2, 600))  # refused: 1 200 bytes would wait for bj
    first = await sh.service.receive("t", "bj", None, 1.0)  # room again, the retry not yet run
    sh.delivery.received("bj", received(3, 10))  # fits now, but must not overtake message 2
    second = await sh.service.receive("t", "bj", None, 1.0)
    third = await sh.service.receive("t", "bj", None, 1.0)
    assert [first.msg_id, second.msg_id, third.msg_id] == [1, 2, 3]
    assert bytes(second.payload) == b"\x02" * 600 and bytes(third.payload) == b"\x03" * 10
    await sh.close()


def test_a_refused_delivery_keeps_its_place_among_its_sources_messages(tmp_path: Path) -> None:
    run(_order(tmp_path))


# ------------------------------------------------------------ draining


class _Replaying:
    """A session whose events are the given ones (a compiled session's methods cannot be
    replaced on the instance)."""

    def __init__(self, session: object, events: list[MessageReceived]) -> None:
        self._session = session
        self._events = events

    def next_event(self) -> MessageReceived | None:
        return self._events.pop() if self._events else None

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)


def test_a_drain_of_events_never_runs_inside_another(tmp_path: Path) -> None:
    """What a drain does to the session only queues events for the same drain; a sink
    that fed an input back into the driver from inside it would re-enter, and is
    refused loudly rather than reordering the events."""

    async def main() -> None:
        _, sh_site = write_site_configs(tmp_path, 2, 1, mtu=1500)
        sh = Gateway(load_config(sh_site.config_path))
        driver = sh.peers["bj"]
        driver._session = _Replaying(driver._session, [received(1, 10)])  # type: ignore[assignment]

        class Reentering:
            def received(self, source: str, event: MessageReceived) -> bool:
                driver.consumed(event.body_bytes, event.msg_id)  # an input, from a drain
                return False

        driver._sink = Reentering()  # type: ignore[assignment]
        with pytest.raises(RuntimeError, match="events of bj drained from within their own"):
            driver.consumed(0, 0)
        await sh.close()

    run(main())


# ------------------------------------------------------------- delivery


async def _reply_before_sending(directory: Path) -> None:
    bj, sh = await pair(directory)
    try:
        order: list[str] = []
        receiving = link(bj, "sh", A)
        assert receiving is not None
        driver = bj.peers["sh"]
        handled, send_now = driver.datagrams_handled, receiving.send_now

        def spy_handled() -> bool:
            handed = handled()
            if handed:
                order.append("handed")
            return handed

        def spy_send_now() -> None:
            order.append("send")
            send_now()

        driver.datagrams_handled = spy_handled  # type: ignore[method-assign]
        receiving.send_now = spy_send_now  # type: ignore[method-assign]

        async def trainer() -> bytes:
            delivery = await bj.service.receive("w", "sh", None, 10.0)
            order.append("trainer")
            return bytes(delivery.payload)

        waiting = asyncio.create_task(trainer())
        await asyncio.sleep(0)  # the recv waits before anything arrives
        await sh.service.submit(submission("bj", "w", b"\x05" * 3000))
        assert await waiting == b"\x05" * 3000
        # the trainer's recv resumed right after the message was handed over, before
        # the link sent its own control frames and data
        handed_at = order.index("handed")
        assert order[handed_at + 1] == "trainer", order
    finally:
        await sh.close()
        await bj.close()


def test_a_waiting_recv_is_answered_before_the_link_sends_again(tmp_path: Path) -> None:
    run(_reply_before_sending(tmp_path))


def test_a_channel_is_kept_filled_to_half_a_millisecond_of_its_pacing_rate() -> None:
    assert pending_low_water(0.0, 1452) == PENDING_LOW_WATER  # no rate yet
    assert pending_low_water(12.5e6, 1452) == PENDING_LOW_WATER  # 100 Mbit/s: 4 of them
    assert pending_low_water(175e6, 1452) == 60  # 1.4 Gbit/s: 87,500 B
    assert pending_low_water(1e12, 1452) == PENDING_HIGH_WATER
    assert pending_low_water(1e9, 0) == PENDING_HIGH_WATER  # never divides by zero
