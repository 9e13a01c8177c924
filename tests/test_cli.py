"""The `wangate` command against real daemons: paths (table, JSON, watch), status, certs,
demo."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wangate.demo import BUCKET_BYTES, plan_workers, run_demo
from wangate.loopback import LoopbackSites
from wangate.rows import GatewayStatus, PathRow

pytestmark = pytest.mark.timeout(120)

CONTRACT_KEYS = {
    "peer", "path", "local", "remote", "state", "srtt_ms", "min_rtt_ms", "jitter_ms",
    "loss", "rate_mbps", "sent_bytes", "recv_bytes", "role",
}  # fmt: skip


def wangate(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wangate", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 2, directory=tmp_path_factory.mktemp("cli"), mtu=1500) as lab:
        yield lab


def test_paths_json_has_the_contract_keys(sites: LoopbackSites) -> None:
    deadline = time.monotonic() + 10
    while True:  # a path takes the critical role once a few probes validated it
        result = wangate("paths", "-s", str(sites["bj"].socket_path), "--json")
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)
        if any(r["role"] == "critical" for r in rows) or time.monotonic() > deadline:
            break
    assert [(r["peer"], r["path"]) for r in rows] == [("sh", "fiber-a"), ("sh", "fiber-b")]
    # (``worker`` only with worker processes: proto/localapi.md)
    every_key = [f.name for f in dataclasses.fields(PathRow) if f.name != "worker"]
    for row in rows:
        assert row.keys() >= CONTRACT_KEYS
        assert list(row) == every_key  # every row has every key, in the documented order
        assert row["state"] in ("up", "degraded")
        assert isinstance(row["capacity_mbps"], float) and row["capacity_mbps"] >= 0.0
        plane = row["data_plane"]  # every datagram went through the path's channel
        assert plane["packets_sent"] >= plane["datagrams_sent"] > 0
        assert plane["not_opened"] == plane["send_errors"] == 0
        assert row["role"] in ("critical", "backup", "bulk")
        assert row["local"].startswith("127.0.10.")
        assert row["remote"].startswith("127.0.11.")
    assert sum(r["role"] == "critical" for r in rows) == 1


def test_paths_table_reads_the_socket_from_the_config(sites: LoopbackSites) -> None:
    result = wangate("paths", "-c", str(sites["sh"].config_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["PEER", "PATH", "LOCAL", "->"]
    assert [line.split()[:2] for line in lines[1:]] == [["bj", "fiber-a"], ["bj", "fiber-b"]]


def test_paths_watch_refreshes_until_interrupted(sites: LoopbackSites) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "wangate", "paths", "-s", str(sites["bj"].socket_path),
         "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    seen: list[str] = []
    for line in process.stdout:  # until the third table (the module's timeout bounds it)
        seen.append(line)
        if sum("PEER  PATH" in x for x in seen) == 3:
            break
    process.terminate()
    process.communicate(timeout=10)
    assert process.returncode == -signal.SIGTERM
    text = "".join(seen)
    assert text.count("\033[2J\033[H") == 3 and text.count(" site bj\n") == 3  # cleared each time
    rows = [line.split()[:2] for line in seen if line.startswith("sh ")]
    assert rows == [["sh", "fiber-a"], ["sh", "fiber-b"]] * 2  # two whole tables before the third


def test_status_and_a_missing_socket(sites: LoopbackSites, tmp_path: Path) -> None:
    result = wangate("status", "-s", str(sites["bj"].socket_path), "--json")
    status = json.loads(result.stdout)
    assert GatewayStatus.from_dict(status).to_dict() == status  # nothing lost or added
    assert status["site"] == "bj"
    assert status["peers"]["sh"]["paths_up"] == ["fiber-a", "fiber-b"]
    missing = wangate("status", "-s", str(tmp_path / "nope.sock"))
    assert missing.returncode == 2
    assert "is `wangate run` running?" in missing.stderr


def test_certs_commands_make_a_ca_and_a_site(tmp_path: Path) -> None:
    assert wangate("certs", "ca", str(tmp_path)).returncode == 0
    assert wangate("certs", "site", str(tmp_path), "bj").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bj.key", "bj.pem", "ca.key", "ca.pem"]
    assert (tmp_path / "bj.key").stat().st_mode & 0o777 == 0o600
    again = wangate("certs", "ca", str(tmp_path))
    assert again.returncode == 2 and "ca.pem" in again.stderr  # no silent overwrite


# ------------------------------------------------------------------ wangate demo


@pytest.mark.parametrize(
    ("cores", "sites", "count"),
    [(2, 3, 1), (8, 3, 1), (12, 3, 3), (16, 2, 4), (64, 3, 4)],
)
def test_the_demo_sizes_each_gateway_to_its_share_of_the_host(
    cores: int, sites: int, count: int
) -> None:
    plan = plan_workers(cores, sites, paths=3)
    assert plan.count == count
    assert f"{cores} cores for {sites} gateways" in plan.why
    assert plan.why.startswith("none" if count == 1 else f"{count} per gateway")


def test_the_demo_moves_every_array_and_says_what_moved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_demo(sites=2, paths=1, size_mib=1) == 0
    out = capsys.readouterr().out
    assert "worker processes: " in out
    assert "site bj: wangate paths" in out and "site sh: wangate paths" in out
    buckets = (1 << 20) // BUCKET_BYTES
    for pair in ("bj -> sh", "sh -> bj"):  # per pair: arrays, bytes, time, rate
        line = next(line for line in out.splitlines() if line.strip().startswith(pair))
        assert f"{2 * buckets} of {2 * buckets} arrays" in line and "Mbit/s" in line
    assert "Mbit/s aggregate" in out
    assert "critical arrays, handed to the gateway to received: median" in out
    assert "paths after the run: " in out
    for name in ("bj", "sh"):
        assert f"  {name} daemon: " in out
    assert "demo OK: every array arrived bit for bit" in out
