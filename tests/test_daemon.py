"""The real daemon under bad input: impostor gateways, garbage on the socket, bad config."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent

from wangate.certs import create_ca, issue_site_certificate
from wangate.core.frames import Hello, encode_control, encode_probe
from wangate.loopback import LoopbackSites, site_address
from wangate.net.tls import ALPN, AUTHENTICATION_FAILED_ERROR_CODE

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 1, directory=tmp_path_factory.mktemp("sites"), mtu=1500) as lab:
        yield lab


def listen_port(lab: LoopbackSites) -> int:
    text = lab["bj"].config_path.read_text()
    return int(text.split(f'"{site_address(0, 0)}:')[1].split('"')[0])


class Recorder(QuicConnectionProtocol):
    terminated: ConnectionTerminated | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event


async def impostor(port: int, cert_dir: Path | None, site: str) -> ConnectionTerminated | None:
    """Dial bj like a gateway would, with the given certificate, and send data at once."""
    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=[ALPN], max_datagram_frame_size=65536
    )
    configuration.verify_mode = 0  # we test the server's check, not ours
    if cert_dir is not None:
        configuration.load_cert_chain(cert_dir / f"{site}.pem", cert_dir / f"{site}.key")
    async with connect(
        site_address(0, 0), port, configuration=configuration, create_protocol=Recorder
    ) as client:
        assert isinstance(client, Recorder)
        quic = client._quic
        quic.send_stream_data(0, encode_control(Hello(site, "fiber-a", 7, 1 << 20)))
        quic.send_datagram_frame(encode_probe(1, 1))
        client.transmit()
        for _ in range(100):
            if client.terminated is not None:
                break
            await asyncio.sleep(0.05)
        return client.terminated


@pytest.mark.parametrize("who", ["no certificate", "another CA", "site not configured"])
def test_an_impostor_gateway_is_refused_before_any_data(
    sites: LoopbackSites, tmp_path: Path, who: str
) -> None:
    certs = sites.directory / "certs"
    if who == "no certificate":
        cert_dir, site = None, "sh"
    elif who == "another CA":
        cert_dir = tmp_path / "other"
        create_ca(cert_dir)
        issue_site_certificate(cert_dir, "sh")
        site = "sh"
    else:
        cert_dir, site = certs, "gz"
        issue_site_certificate(certs, "gz", force=True)
    with sites["bj"].client() as gw:
        before = gw.status()
    terminated = asyncio.run(impostor(listen_port(sites), cert_dir, site))
    assert terminated is not None
    assert terminated.error_code == AUTHENTICATION_FAILED_ERROR_CODE
    assert "site authentication failed" in terminated.reason_phrase
    with sites["bj"].client() as gw:
        after = gw.status()
        paths = gw.paths()
    assert list(after["peers"]) == ["sh"]  # no session was made for the impostor
    for key in ("messages_received", "bytes_received", "inbound_in_progress"):
        assert after["peers"]["sh"][key] == before["peers"]["sh"][key]
    # the real peer is unaffected (a busy machine may show it degraded, never down)
    assert {row["state"] in ("up", "degraded") for row in paths} == {True}  # a row per worker
    assert "site authentication failed" in sites["bj"].log_path.read_text()


def test_garbage_on_the_socket_gets_an_error_and_others_keep_working(
    sites: LoopbackSites,
) -> None:
    for junk in (b"GET / HTTP/1.1\r\n\r\n", b"WG\x01\x00" + b"\xff" * 12, os.urandom(4096)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(sites["bj"].socket_path))
            raw.sendall(junk)
            raw.shutdown(socket.SHUT_WR)
            raw.settimeout(10)
            reply = b""
            while chunk := raw.recv(65536):
                reply += chunk
        assert reply.startswith(b"WG\x01\x00")  # an error reply, then the connection closes
        assert b"ok" in reply and b"error" in reply
    arr = np.arange(1000, dtype=np.float64)
    with sites["bj"].client() as gw:
        gw.send("sh", "still-serving", arr, step=3)
    with sites["sh"].client() as gw:
        assert gw.recv("still-serving", source="bj", step=3, timeout=30).tobytes() == arr.tobytes()


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wangate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_broken_config_exits_before_listening(sites: LoopbackSites, tmp_path: Path) -> None:
    text = sites["bj"].config_path.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace("[tls]", "[tls]\ncolour = 'blue'").replace(
            'socket = "bj.sock"', f'socket = "{tmp_path / "bad.sock"}"'
        )
    )
    (tmp_path / "certs").symlink_to(sites.directory / "certs")
    result = run_cli("run", "-c", str(bad))
    assert result.returncode == 2
    assert f"{bad}" in result.stderr and "tls" in result.stderr and "colour" in result.stderr
    assert not (tmp_path / "bad.sock").exists()


def test_sigterm_shuts_down_cleanly(tmp_path: Path) -> None:
    lab = LoopbackSites(2, 1, directory=tmp_path, mtu=1500)
    with lab:
        assert lab["bj"].socket_path.exists()
        process = lab["bj"].process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert not lab["bj"].socket_path.exists()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with lab["sh"].client() as gw:
                if gw.paths()[0]["state"] == "down":
                    break
            time.sleep(0.1)
        with lab["sh"].client() as gw:
            assert gw.paths()[0]["state"] == "down"  # the peer noticed at once


def test_a_send_deadline_fails_the_message_when_the_peer_is_gone(tmp_path: Path) -> None:
    with LoopbackSites(2, 1, directory=tmp_path, mtu=1500) as lab:
        process = lab["sh"].process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        with lab["bj"].client() as gw:
            array = np.arange(10_000, dtype=np.float32)
            sent_at = time.monotonic()
            msg_id = gw.send("sh", "grad", array, deadline_s=0.5)
            failures: list[dict[str, object]] = []
            while time.monotonic() < sent_at + 10 and not failures:
                time.sleep(0.05)
                failures = gw.status()["peers"]["sh"]["recent_failures"]
            assert time.monotonic() - sent_at >= 0.5
            assert msg_id >= 1
            assert len(failures) == 1
            assert failures[0]["msg_id"] == msg_id
            assert (failures[0]["tag"], failures[0]["step"]) == ("grad", 0)
            reason = failures[0]["reason"]
            assert isinstance(reason, str)
            assert reason.startswith("deadline of 0.5 s passed before sh confirmed it (0 of ")
            gw.send("bj", "self", array)  # the gateway goes on serving
            assert np.array_equal(gw.recv("self", source="bj", timeout=5), array)
