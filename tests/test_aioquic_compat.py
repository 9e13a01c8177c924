"""The start-up check of aioquic's private parts fails loudly, naming what moved."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aioquic.tls
import pytest
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketRecovery

from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.errors import GatewayError
from wangate.loopback import write_site_configs
from wangate.net import aioquic_compat
from wangate.net.aioquic_compat import AioquicIncompatible, check_aioquic


def test_the_installed_aioquic_passes() -> None:
    check_aioquic()


def _drop_after_init(monkeypatch: pytest.MonkeyPatch, cls: type, attribute: str) -> None:
    original = vars(cls)["__init__"]

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        delattr(self, attribute)

    monkeypatch.setattr(cls, "__init__", init)


@pytest.mark.parametrize(
    ("cls", "attribute", "owner"),
    [
        (QuicConnection, "_datagrams_pending", "QuicConnection"),
        (QuicConnection, "_network_paths", "QuicConnection"),
        (QuicConnection, "_handshake_complete", "QuicConnection"),
        (QuicConnection, "_peer_cid", "QuicConnection"),
        (QuicConnection, "_original_destination_connection_id", "QuicConnection"),
        (QuicPacketRecovery, "_pacer", "QuicPacketRecovery"),
        (aioquic.tls.Context, "_request_client_certificate", "tls.Context"),
        (aioquic.tls.Context, "_peer_certificate", "tls.Context"),
        (aioquic.tls.Context, "_peer_certificate_chain", "tls.Context"),
    ],
)
def test_a_moved_attribute_is_named(
    monkeypatch: pytest.MonkeyPatch, cls: type, attribute: str, owner: str
) -> None:
    _drop_after_init(monkeypatch, cls, attribute)
    with pytest.raises(AioquicIncompatible) as error:
        check_aioquic()
    assert f"{owner} has no attribute {attribute!r}" in str(error.value)
    assert f"aioquic {aioquic.__version__}" in str(error.value)


@pytest.mark.parametrize(
    ("cls", "attribute", "owner"),
    [
        (QuicConnection, "_replenish_connection_ids", "QuicConnection"),
        (QuicConnection, "_write_datagram_frame", "QuicConnection"),
        (QuicPacketBuilder, "remaining_flight_space", "QuicPacketBuilder"),
        (QuicPacketBuilder, "start_frame", "QuicPacketBuilder"),
    ],
)
def test_a_moved_method_is_named(
    monkeypatch: pytest.MonkeyPatch, cls: type, attribute: str, owner: str
) -> None:
    monkeypatch.delattr(cls, attribute)
    with pytest.raises(AioquicIncompatible) as error:
        check_aioquic()
    assert f"{owner} has no attribute {attribute!r}" in str(error.value)


def test_an_initialize_hook_that_is_never_called_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # an aioquic whose connect() builds its TLS context some other way
    monkeypatch.setattr(aioquic_compat, "after_initialize", lambda connection, hook: None)
    with pytest.raises(AioquicIncompatible, match="no attribute '_initialize'"):
        check_aioquic()


def test_the_daemon_refuses_to_start_with_an_incompatible_aioquic(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _drop_after_init(monkeypatch, QuicConnection, "_datagrams_pending")
    _, sh_site = write_site_configs(tmp_path, 2, 1, mtu=1500)
    gateway = Gateway(load_config(sh_site.config_path))

    async def start() -> None:
        try:
            await gateway.start()
        finally:
            await gateway.close()

    with pytest.raises(GatewayError) as error:
        asyncio.run(start())
    assert error.value.code == "startup"
    assert "'_datagrams_pending'" in str(error.value)
    assert not sh_site.socket_path.exists()  # it stopped before listening
