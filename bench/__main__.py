"""python -m bench COMMAND ... : every benchmark, by subject (python -m bench COMMAND -h).

The lab runs (run, suite, baselines, lab, and what says "lab") need root and
/dev/net/tun. Whatever starts gateway daemons takes ``--tree PATH_OR_COMMIT``
(repeatable): the same measurement again with that tree's daemons, alternately
(bench/tree.py). Results go to results/.
"""

from __future__ import annotations

import importlib
import sys

from wangate.errors import WangateError

# command -> module with main(argv) -> int, and what it is for
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("bench.runner.cli", "lab scenarios through the runner: gateways, baselines, records"),
    "suite": ("bench.suite", "named suites by subject: loss, fair, critical, failover, ..."),
    "baselines": ("bench.runner.baselines", "TCP cubic, TCP BBR, aioquic stream alone, lab"),
    "budget": ("bench.runner.budget", "where the link rate went in a run.json"),
    "plots": ("bench.runner.plots", "redraw PNGs from results/<scenario>/run.json"),
    "lab": ("wangate.lab.__main__", "the WAN lab: check, up, selftest, cleanup"),
    "jobs": ("bench.jobs.lab", "jobs in the lab: weighted share, critical, stuck, placement"),
}
# subject -> command -> (module, what)
SUBJECTS: dict[str, dict[str, tuple[str, str]]] = {
    "transport": {
        "loss": ("bench.transport.loss", "lossy paths against TCP BBR, repair trade, controller"),
        "critical": ("bench.transport.critical", "the lab floor of a critical message"),
        "cpu": ("bench.transport.cpu", "CPU per byte against plain aioquic, loopback"),
        "workers": ("bench.transport.workers", "CPU per GiB with worker processes, loopback"),
        "throughput": ("bench.transport.throughput", "goodput of two daemons on loopback"),
        "fec": ("bench.transport.fec", "FEC coding speed; congestion controllers in the lab"),
        "probe": ("bench.transport.probe", "wangate probe's readings against the lab's truth"),
        "floor": ("bench.transport.floor", "the kernel-UDP floor: Mbit per CPU-second, loopback"),
        "core": ("bench.transport.core", "the sans-IO core's microseconds per datagram, no I/O"),
    },
    "codecs": {
        "speed": ("bench.codecs.speed", "codec throughput and compression ratio"),
        "convergence": ("bench.codecs.convergence", "training loss under each codec"),
    },
    "localapi": {
        "idle": ("bench.localapi.idle", "what an idle trainer connection costs the daemon"),
        "shm": ("bench.localapi.shm", "shared-memory payloads: hand-over, streaming, memory"),
        "handover": ("bench.localapi.handover", "a small message's send, warm and after a gap"),
        "cold": ("bench.localapi.cold", "what touching memory costs after the core slept"),
    },
    "robustness": {
        "flood": ("bench.robustness.flood", "forged QUIC packets against a daemon pair"),
        "faults": ("bench.robustness.faults", "kills, restarts, deadlines as a trainer sees them"),
        "watchdog": ("bench.robustness.watchdog", "event-loop stalls as systemd's watchdog sees"),
        "soak": (
            "bench.robustness.soak.cli",
            "seeded random faults in the lab, invariants checked",
        ),
    },
    "training": {
        "fidelity": ("bench.training.fidelity", "PyTorch DDP and DiLoCo over real gateways"),
        "search": ("bench.training.search", "training fidelity over searched settings"),
    },
    "collectives": {
        "lab": ("bench.collectives.lab", "allreduce in the lab against Gloo and all-to-all"),
        "loopback": ("bench.collectives.loopback", "allreduce against all-to-all, loopback"),
    },
}


def usage() -> str:
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name:12} {what}" for name, (_, what) in COMMANDS.items()]
    for subject, commands in SUBJECTS.items():
        lines += ["", f"{subject}:"]
        lines += [f"  {subject} {name:12} {what}" for name, (_, what) in commands.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in ([], ["-h"], ["--help"]):
        print(usage())
        return 0 if argv else 2
    if argv[0] in COMMANDS:
        module, rest = COMMANDS[argv[0]][0], argv[1:]
    elif argv[0] in SUBJECTS and argv[1:2] and argv[1] in SUBJECTS[argv[0]]:
        module, rest = SUBJECTS[argv[0]][argv[1]][0], argv[2:]
    else:
        print(f"python -m bench: no command {' '.join(argv[:2])!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(module).main(rest) or 0)
    except WangateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
