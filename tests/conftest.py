"""The test tiers, one per test file, each a marker (``pytest -m pure``, ``-m "not daemons"``):

- ``pure``: sans-IO units: no socket, no event loop, no clock but the one passed in;
- ``sim``: the sans-IO core driven over the simulated link and clock (tests/fakelink.py);
- ``daemons``: real I/O on this machine: sockets and event loops in the test process,
  daemon processes on loopback (``wangate.loopback.LoopbackSites``), the CLI;
- ``netns``: the WAN lab (``wangate.lab``): network namespaces, root and /dev/net/tun.

A file's tier is the heaviest thing its tests need, so that ``-m pure`` never opens a
socket. A test marked ``netns`` by itself is in the ``netns`` tier whatever its file's.
A test file missing from ``TIERS`` is an error: a new file says where it belongs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIER_NAMES = ("pure", "sim", "daemons", "netns")

PURE = """admission certs checksum claims codec_feedback codec_helpers codec_malformed
codec_roundtrip codec_spec codec_vectors coding collective_plan collective_routes config
config_access config_jobs control_outbox error_codes estimator fairqueue fec frames
fuzz_codec fuzz_config fuzz_localapi fuzz_wire import_graph inbound inbound_progress
lab_model localapi_protocol localapi_replies message names outbound outbox outbox_jobs
pacing path_table paths placement probe_rate ranges_missing rangeset replay scheduler
shard_placing timers daemon_process inbound_segments
workers_receiving workers_stripes
engine_crypto engine_frames engine_cc engine_recovery engine_received
engine_fuzz_regressions"""
SIM = """capacity governor late_timer liveness repair_budget rows selector session session_fec
session_idle session_jobs session_reads shard_spans"""
DAEMONS = """aioquic_compat auth cli client client_timeout collective congestion connect_race
daemon datagram_size dial_replaced e2e faults flood link_close listener localapi_access
localapi_framing localapi_mailbox localapi_segments localapi_server localapi_stream loopback
jobs metrics peer_driver probe reload startup_errors systemd torch_ddp torch_diloco
torch_tensors workers workers_channel
engine_channel engine_gso engine_read engine_listener_read engine_hostile segment_reuse"""
NETNS = "lab_netns lab_probe lab_siteroutes"

TIERS = {
    f"test_{name}.py": tier
    for tier, names in (("pure", PURE), ("sim", SIM), ("daemons", DAEMONS), ("netns", NETNS))
    for name in names.split()
}


def assign_tiers(items: list[pytest.Item], tiers: dict[str, str], directory: Path) -> None:
    """Give each test of ``directory`` its file's tier marker (``netns`` if marked so)."""
    for item in items:
        if item.path.parent != directory:
            continue
        tier = tiers.get(item.path.name)
        if tier is None:
            raise pytest.UsageError(
                f"{item.path}: no test tier; add it to TIERS in {directory / 'conftest.py'} "
                f"(one of {', '.join(TIER_NAMES)})"
            )
        if item.get_closest_marker("netns") is not None:
            tier = "netns"
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    assign_tiers(items, TIERS, Path(__file__).resolve().parent)


def stale_compiled_modules(core: Path) -> list[str]:
    """The core modules whose compiled form (mypyc, setup.py) is older than their source:
    Python would import the compiled one, so the tests would run yesterday's code."""
    stale = []
    for compiled in sorted(core.glob("*.so")):
        source = compiled.with_name(compiled.name.split(".")[0] + ".py")
        if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
            stale.append(source.name)
    return stale


def pytest_sessionstart(session: pytest.Session) -> None:
    core = Path(__file__).resolve().parent.parent / "wangate" / "core"
    stale = stale_compiled_modules(core)
    if stale:
        raise pytest.UsageError(
            f"wangate/core: {', '.join(stale)} changed since they were compiled; "
            "run `make setup` (or delete wangate/core/*.so to test them interpreted)"
        )
