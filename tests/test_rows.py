"""Path rows and status: one definition, read back exactly, refused when malformed, and
documented key for key in proto/localapi.md; the text views print them."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fakelink import LinkProfile, SimulatedPair
from wangate.errors import RemoteProtocolError
from wangate.rows import GatewayStatus, PathRow, PeerStatus
from wangate.views import format_paths_table, format_status

DOC = Path(__file__).resolve().parent.parent / "proto" / "localapi.md"

UP: dict[str, Any] = {
    "peer": "sh", "path": "fiber-a", "local": "127.0.10.1:40000",
    "remote": "[::1]:7443", "state": "degraded", "state_reason": "srtt 90 ms > 3x min 20 ms",
    "srtt_ms": 90.0, "min_rtt_ms": 20.0, "jitter_ms": 0.5, "loss": 0.0125, "loss_samples": 800,
    "rate_mbps": 93.25, "sent_bytes": 3 << 30, "recv_bytes": 1536, "role": "critical",
    "peer_state": "up", "rtt_p99_ms": 120.0, "inflight_bytes": 4096, "acked_bytes": 1000,
    "lost_bytes": 12, "spurious_losses": 1, "rto_ms": 250.0, "peer_role": "bulk",
    "last_switch_s": 0.25, "last_switch_reason": "fiber-b lost 3 probes",
    "capacity_mbps": 95.5, "jobs": {"default": {"bytes_sent": 3 << 30, "datagrams_sent": 9000}},
    "data_plane": {"packets_sent": 9001, "not_opened": 2, "smoothed_rtt_s": 0.09},
}  # fmt: skip


def test_a_row_reads_back_exactly_and_ignores_keys_it_does_not_know() -> None:
    row = PathRow.from_dict({**UP, "usable": True, "from_a_later_gateway": [1]})
    assert row.to_dict() == UP
    assert list(row.to_dict()) == list(UP)  # key order: the contract's first
    assert json.loads(json.dumps(row.to_dict())) == UP


def test_a_path_never_connected_has_every_key_and_nothing_measured() -> None:
    row = PathRow.not_connected("sh", "fiber-b", "*", "(peer dials)", "unreachable")
    as_dict = row.to_dict()
    assert as_dict.keys() == UP.keys()
    assert {k for k, v in as_dict.items() if v is None} == {
        "srtt_ms", "min_rtt_ms", "jitter_ms", "loss", "rate_mbps", "rtt_p99_ms",
        "inflight_bytes", "acked_bytes", "lost_bytes", "spurious_losses", "rto_ms",
        "peer_role", "last_switch_s", "last_switch_reason", "capacity_mbps",
    }  # fmt: skip
    assert (row.state, row.state_reason, row.role, row.peer_state) == (
        "down",
        "not connected",
        "bulk",
        "unreachable",
    )
    assert (row.loss_samples, row.sent_bytes, row.recv_bytes) == (0, 0, 0)


def test_an_integer_where_a_number_goes_becomes_a_float() -> None:
    row = PathRow.from_dict({**UP, "srtt_ms": 90, "loss": 0})
    assert row.srtt_ms == 90.0 and isinstance(row.srtt_ms, float)
    assert row.loss == 0.0 and isinstance(row.loss, float)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"state": "sideways"}, r"'state' is 'sideways', not one of \('up', 'degraded', 'down'\)"),
        ({"peer_state": "gone"}, r"'peer_state' is 'gone'"),
        ({"srtt_ms": "fast"}, r"'srtt_ms' must be float \| None, got 'fast'"),
        ({"sent_bytes": 1.5}, r"'sent_bytes' must be int, got 1.5"),
        ({"sent_bytes": True}, r"'sent_bytes' must be int, got True"),
        ({"loss_samples": None}, r"'loss_samples' must be int, got None"),
        ({"peer": 7}, r"'peer' must be str, got 7"),
    ],
)
def test_a_malformed_row_is_refused_naming_the_key(change: dict[str, Any], error: str) -> None:
    with pytest.raises(RemoteProtocolError, match=f"path row: {error}"):
        PathRow.from_dict({**UP, **change})


def test_a_row_missing_a_contract_key_is_refused() -> None:
    for key in ("peer", "state", "loss", "role", "peer_state"):
        row = {k: v for k, v in UP.items() if k != key}
        with pytest.raises(RemoteProtocolError, match=f"path row: missing '{key}'"):
            PathRow.from_dict(row)
    # the keys known only once a path was connected may be left out
    contract = {f.name for f in dataclasses.fields(PathRow) if f.default is dataclasses.MISSING}
    assert PathRow.from_dict({k: UP[k] for k in contract}).rto_ms is None


STATUS: dict[str, Any] = {
    "site": "bj", "version": "0.1.0", "uptime_s": 12.5, "local_messages": 3,
    "inbox": {"queued": 2, "waiting_recvs": 1},
    "segments": {"made": 9, "reused": 40, "live": 3, "lent": 1, "pooled": 2,
                 "pooled_bytes": 1 << 25},
    "peers": {"sh": {
        "state": "up", "state_reason": "ok", "silent_s": 0.01, "messages_held": 0,
        "paths_up": ["fiber-a"], "messages_sent": 5, "bytes_sent": 5 << 20,
        "messages_received": 4, "bytes_received": 2048,
        "recent_failures": [{"msg_id": 9, "tag": "g", "step": 3, "reason": "deadline"}],
    }},
    "jobs": {"default": {"weight": 1.0, "paths": None, "sites": None, "inbox_queued": 2,
                         "inbox_bytes": 640, "claims": 0, "recent_failures": [],
                         "peers": {"sh": {"bytes_sent": 5 << 20, "bytes_received": 2048,
                                          "messages_in_flight": 0, "held_bytes": 0,
                                          "waiting_bytes": 0, "waiting_messages": 0}}}},
}  # fmt: skip


def test_status_reads_back_exactly() -> None:
    status = GatewayStatus.from_dict(STATUS)
    assert status.to_dict() == STATUS
    peer = status.peers["sh"]
    assert peer.counter("messages_sent") == 5 and peer.counter("not_a_counter") == 0
    assert peer.paths_up == ("fiber-a",)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ({**STATUS, "inbox": None}, "'peers' and 'inbox' must be maps"),
        ({**STATUS, "peers": {"sh": []}}, "a peer must be a map"),
        ({**STATUS, "uptime_s": "long"}, "'uptime_s' must be float"),
        ({**STATUS, "peers": {"sh": {**STATUS["peers"]["sh"], "state": "?"}}}, "'state' is '?'"),
        ({k: v for k, v in STATUS.items() if k != "site"}, "missing 'site'"),
    ],
)
def test_a_malformed_status_is_refused(status: dict[str, Any], error: str) -> None:
    with pytest.raises(RemoteProtocolError, match=re.escape(error)):
        GatewayStatus.from_dict(status)


# ------------------------------------------------------------------- docs


def documented_row_keys() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("### Path rows and status") :]
    table = section[: section.index("The `status` map")]
    return re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)


def test_the_doc_lists_every_row_key_in_order() -> None:
    assert documented_row_keys() == [f.name for f in dataclasses.fields(PathRow)]


def test_the_doc_lists_every_peer_counter_and_status_key() -> None:
    pair = SimulatedPair({"a": LinkProfile(delay_s=0.01)})
    counters = pair.sessions["bj"].status()
    text = DOC.read_text()
    status_doc = text[text.index("The `status` map") : text.index("Failure: exactly")]
    for key in [*counters, *STATUS, *STATUS["peers"]["sh"], "inbound_in_progress"]:
        assert f"`{key}`" in status_doc or f'"{key}"' in status_doc, key
    # a peer's named fields and its counters do not overlap
    named = {f.name for f in dataclasses.fields(PeerStatus)}
    assert named & set(counters) == set()


# ------------------------------------------------------------------ views


def test_the_paths_table_shows_each_row() -> None:
    down = PathRow.not_connected("sh", "fiber-b", "*", "(peer dials)")
    lines = format_paths_table([PathRow.from_dict(UP), down]).splitlines()
    assert lines[0].split("  ")[0] == "PEER"
    assert lines[1].split() == [
        "sh", "fiber-a", "127.0.10.1:40000", "->", "[::1]:7443", "degraded", "90.00/20.00",
        "0.50", "1.25%", "(800)", "93.2", "3.0", "GiB", "1.5", "KiB", "critical",
        "250ms", "ago", "srtt", "90", "ms", ">", "3x", "min", "20", "ms",
    ]  # fmt: skip
    assert lines[2].split() == [
        "sh", "fiber-b", "*", "->", "(peer", "dials)", "down", "-/-", "-", "-", "-", "0", "B",
        "0", "B", "bulk", "-", "not", "connected",
    ]  # fmt: skip


def test_status_text_names_peers_paths_and_failures() -> None:
    assert format_status(GatewayStatus.from_dict(STATUS)).splitlines() == [
        "site bj  version 0.1.0  up 12 s",
        "  peer sh: up (ok); paths up: fiber-a; sent 5 messages (5.0 MiB), received 4 (2.0 KiB)",
        "    failed: message 9 (tag 'g', step 3): deadline",
        "  inbound segments: made 9, reused 40; lent 1, pooled 2 (32.0 MiB)",
    ]


def test_a_paths_reply_that_is_not_a_list_of_maps_is_refused() -> None:
    assert PathRow.from_dicts([UP]) == [PathRow.from_dict(UP)]
    with pytest.raises(RemoteProtocolError, match="path rows must be a list, not dict"):
        PathRow.from_dicts({"rows": []})
    with pytest.raises(RemoteProtocolError, match="path row must be a map, not str"):
        PathRow.from_dicts(["sh"])


def test_a_gateway_reports_its_unconnected_paths_as_rows(tmp_path: Path) -> None:
    from wangate.config import load_config
    from wangate.daemon import Gateway
    from wangate.loopback import write_site_configs

    bj, _ = write_site_configs(tmp_path, 2, 2, mtu=1500)
    gateway = Gateway(load_config(bj.config_path))  # not started: nothing connected
    rows = gateway.service.paths()
    assert [(r.peer, r.path, r.state, r.state_reason) for r in rows] == [
        ("sh", "fiber-a", "down", "not connected"),
        ("sh", "fiber-b", "down", "not connected"),
    ]
    assert all(r.srtt_ms is None and r.sent_bytes == 0 and r.role == "bulk" for r in rows)
    status = gateway.service.status()
    assert status.site == "bj" and list(status.peers) == ["sh"]
    assert status.peers["sh"].paths_up == () and status.peers["sh"].counter("messages_sent") == 0
    assert GatewayStatus.from_dict(status.to_dict()) == status


def test_with_workers_a_row_names_its_worker_and_the_status_lists_them() -> None:
    row = PathRow.from_dict({**UP, "worker": 1})
    assert row.worker == 1 and row.to_dict() == {**UP, "worker": 1}
    assert format_paths_table([row]).splitlines()[1].split()[:2] == ["sh", "fiber-a/w1"]
    worker = {"index": 0, "pid": 41, "role": "critical", "cpu_s": 2.5, "queued_bytes": 2048,
              "stripes": 1, "restarts": 3}  # fmt: skip
    status = GatewayStatus.from_dict({**STATUS, "workers": [worker]})
    assert status.to_dict() == {**STATUS, "workers": [worker]}
    assert format_status(status).splitlines()[-1] == (
        "  worker 0 (critical, pid 41): 2.5 CPU s, 2.0 KiB queued, 3 restarts"
    )
