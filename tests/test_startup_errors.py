"""Start-up failures: exit 2, one line naming the file, the key and the OS error."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wangate.config import load_config
from wangate.errors import ConfigError
from wangate.loopback import SiteProcess, write_site_configs

pytestmark = pytest.mark.timeout(60)


def run_daemon(site: SiteProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wangate", "run", "-c", str(site.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def listen_address(site: SiteProcess) -> tuple[str, int]:
    text = site.config_path.read_text()
    host, port = text.split("listen = [")[1].split('"')[1].rsplit(":", 1)
    return host, int(port)


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"wangate: {message}"


def test_a_listen_address_in_use(tmp_path: Path) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500)[0]
    host, port = listen_address(bj)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((host, port))
        result = run_daemon(bj)
    assert_refused(
        result,
        f"{bj.config_path}: site.listen[0]: cannot listen on {host}:{port}: Address already in use",
    )
    assert not bj.socket_path.exists()


def test_a_listen_address_not_on_this_host(tmp_path: Path) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500)[0]
    host, port = listen_address(bj)
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never assigned here; binding sends nothing
    text = bj.config_path.read_text().replace(f'listen = ["{host}:{port}"]', "")
    bj.config_path.write_text(
        text.replace("[site]\n", f'[site]\nlisten = ["{host}:{port}", "192.0.2.1:{port}"]\n')
    )
    result = run_daemon(bj)
    assert_refused(
        result,
        f"{bj.config_path}: site.listen[1]: cannot listen on 192.0.2.1:{port}: "
        "Cannot assign requested address",
    )


def test_a_socket_in_a_missing_folder(tmp_path: Path) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500)[0]
    bj.config_path.write_text(
        bj.config_path.read_text().replace('socket = "bj.sock"', 'socket = "missing/bj.sock"')
    )
    result = run_daemon(bj)
    assert_refused(
        result,
        f"{bj.config_path}: site.socket: cannot listen on {tmp_path / 'missing/bj.sock'}: "
        "No such file or directory",
    )


def test_a_metrics_address_in_use(tmp_path: Path) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bj.config_path.write_text(
            bj.config_path.read_text().replace(
                "[tls]", f'[metrics]\nlisten = "127.0.0.1:{port}"\n\n[tls]'
            )
        )
        result = run_daemon(bj)
    assert_refused(
        result,
        f"{bj.config_path}: metrics.listen: cannot listen on 127.0.0.1:{port}: "
        "Address already in use",
    )
    assert not bj.socket_path.exists()


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500)[0]
    key = tmp_path / "certs" / "bj.key"
    assert os.stat(key).st_mode & 0o777 == 0o600  # as `wangate certs` writes it
    os.chmod(key, 0o644)
    result = run_daemon(bj)
    assert_refused(
        result,
        f"{bj.config_path}: tls.key: {key} (mode 0644) is readable by its group and others: "
        f"run `chmod 600 {key}`, or set allow_readable_key = true in [tls] to accept it",
    )
    os.chmod(key, 0o640)
    with pytest.raises(ConfigError, match=r"\(mode 0640\) is readable by its group: "):
        load_config(bj.config_path)


def test_a_readable_key_allowed_by_the_config_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500)[0]
    key = tmp_path / "certs" / "bj.key"
    os.chmod(key, 0o604)
    bj.config_path.write_text(
        bj.config_path.read_text().replace("[tls]\n", "[tls]\nallow_readable_key = true\n")
    )
    with caplog.at_level(logging.WARNING, logger="wangate.config"):
        config = load_config(bj.config_path)
    assert config.tls.allow_readable_key is True
    assert caplog.messages == [
        f"{bj.config_path}: tls.key: {key} (mode 0604) is readable by others; "
        "allowed by tls.allow_readable_key"
    ]
    bj.config_path.write_text(
        bj.config_path.read_text().replace("allow_readable_key = true", 'allow_readable_key = "y"')
    )
    with pytest.raises(ConfigError, match=r"tls.allow_readable_key: expected a boolean"):
        load_config(bj.config_path)
