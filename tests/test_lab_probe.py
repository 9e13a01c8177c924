"""`wangate probe` (the CLI, both ends) against the lab emulator's known settings.

The path: 20 Mbit/s, 12 ms one way, 0.5 % random loss each way, 50 ms queue (the
emulator's defaults otherwise), seeded. Tolerances:

* min RTT within 24 ms + 3 ms (two 92-byte serialisations are 0.07 ms; the rest is
  the hosts: TUN, the forwarder, two Python event loops on a shared machine);
* achievable rate (IP bytes at the bottleneck) within 10 % of 20 Mbit/s;
* one-way loss from at least 2000 packets, between 0.2 % and 1 %, its 95 % interval
  reaching below 1 %, and no loss reason in the verdict (0.5 % is good for critical
  traffic; latency reasons may still appear when the machine is loaded);
* with ``--rate-mbps 10`` the path is not saturated: it says so, and reads 10 Mbit/s
  of payload (10.23 of IP) within 5 %.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest

from wangate.lab import netns
from wangate.lab.lab import Lab
from wangate.lab.selftest import two_site_scenario

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
_problem = netns.environment_problem()
if _problem:
    pytestmark.append(pytest.mark.skip(reason=_problem))

PORT = 7444


def _probe(lab: Lab, *args: str) -> dict[str, Any]:
    path = lab.scenario.path("a")
    prober = lab.run_in(
        "bj",
        ["nice", "-n", "-10", sys.executable, "-m", "wangate", "probe", f"{path.address_b}:{PORT}",
         "--local", path.address_a, "--json", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = prober.communicate(timeout=60)
    assert prober.returncode in (0, 1), err.decode()  # 1: judged unusable (checked below)
    report: dict[str, Any] = json.loads(out)
    return report


def test_probe_reads_the_lab_path() -> None:
    scenario = two_site_scenario(
        [{"name": "a", "rate_mbps": 20.0, "delay_ms": 12.0, "loss": 0.005}], seed=7
    )
    with Lab(scenario, run_id="p" + secrets.token_hex(2)) as lab:
        # The emulator is a Python process per path: on a shared machine it must not
        # queue behind other work, or the link it emulates is slower than its settings.
        for pid in lab.forwarder_pids().values():
            with contextlib.suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, pid, -10)
        lab.start_timeline()
        responder = lab.run_in(
            "sh",
            ["nice", "-n", "-10", sys.executable, "-m", "wangate", "probe", "--serve", "--listen",
             f"{scenario.path('a').address_b}:{PORT}", "--forever"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert responder.stdout is not None
        assert responder.stdout.readline().startswith(b"probe responder on")
        report = _probe(lab, "--duration", "8", "--rate-mbps", "100")
        capped = _probe(lab, "--duration", "6", "--rate-mbps", "10")

    min_rtt_ms = report["latency"]["rtt_ms"]["min"]
    assert 24.0 <= min_rtt_ms <= 27.0, report["latency"]
    rate = report["rate"]
    assert rate["limit"] == "path" and rate["capped"] is False, rate
    assert abs(rate["achievable_mbps"] - 20.0) <= 2.0, rate
    loss = rate["loss"]
    assert loss["sent"] >= 2000, loss
    assert 0.002 <= loss["fraction"] <= 0.01, loss
    assert loss["ci95"][0] <= loss["fraction"] <= loss["ci95"][1] < 0.01, loss
    # the saturating trains lost packets at the queue; none of that is path loss
    saturated = [s for s in rate["steps"] if s["kind"] == "saturated"]
    assert saturated, rate["steps"]
    assert report["verdict"]["kind"] != "unusable", report
    assert all("loss" not in reason for reason in report["verdict"]["reasons"]), report["verdict"]

    low_cap = capped["rate"]
    assert low_cap["limit"] == "cap" and low_cap["capped"] is True, low_cap
    assert abs(low_cap["achievable_mbps"] - 10.0 * 1228 / 1200) <= 0.05 * 10.23, low_cap
