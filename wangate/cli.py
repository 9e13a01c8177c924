"""The ``wangate`` command: run the daemon, look at paths, make certificates, demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wangate.errors import WangateError

if TYPE_CHECKING:
    from collections.abc import Coroutine

log = logging.getLogger("wangate")
# Subcommands import what they need when they run (asyncio, the daemon, the client,
# numpy): `wangate --help` and `wangate paths` start in a fraction of the time.
# The collector is left as Python sets it. Freezing start-up objects and making full
# collections 100 times rarer (as the daemon once did) bought nothing measurable: CPU per
# GiB was the same and critical latency within noise either way round, and in one run
# with unpaced traffic the tuned daemon's RSS grew 65 -> 247 MiB against 65 -> 84 MiB
# (bench/RESULTS.md, "Hostile traffic"; bench/robustness/flood_daemon.py --tuned-gc to
# compare again).


def _setup_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose == 1 else logging.WARNING
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


# ------------------------------------------------------------------------ run


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio

    from wangate.config import load_config
    from wangate.daemon import make_gateway
    from wangate.daemon_process import install_event_loop_policy, tune_collector
    from wangate.reload import Reloader
    from wangate.systemd import Notifier

    # SIGHUP's default action kills: until the reload handler is in place it waits
    hangups: list[int] = []
    signal.signal(signal.SIGHUP, lambda signum, frame: hangups.append(signum))
    config_path = Path(args.config)
    config = load_config(config_path)  # errors out before anything listens
    install_event_loop_policy()

    async def main() -> None:
        gateway = make_gateway(config)
        reloader = Reloader(gateway, config_path)
        notifier = Notifier(reloader.status_line)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        def reload() -> None:
            notifier.reloading()
            try:
                reloader.reload()
            except Exception:  # a bug must not leave systemd waiting in "reloading"
                log.exception("reload failed; the daemon goes on")
            finally:
                notifier.reloaded()

        try:
            await gateway.start()
            tune_collector()
            notifier.start()
            loop.add_signal_handler(signal.SIGHUP, reload)
            if hangups:
                reload()
            log.warning("wangate up: site %s, trainers at %s", config.site.name, config.site.socket)
            await stop.wait()
            notifier.stopping()
            log.warning("shutting down")
        finally:
            notifier.stop()
            await gateway.close()

    asyncio.run(main())
    return 0


# --------------------------------------------------------------- paths/status


def _socket_from(args: argparse.Namespace) -> str | None:
    if getattr(args, "socket", None):
        return str(args.socket)
    if getattr(args, "config", None):
        from wangate.config import load_config

        return str(load_config(args.config).site.socket)
    return None


def cmd_paths(args: argparse.Namespace) -> int:
    from wangate.client import Client
    from wangate.rows import PathRow
    from wangate.views import format_paths_table

    with Client(_socket_from(args)) as gw:
        while True:
            rows = PathRow.from_dicts(gw.paths())
            if args.json:
                text = json.dumps([row.to_dict() for row in rows], indent=None if args.watch else 2)
                print(text, flush=True)
            else:
                if args.watch:
                    print("\033[2J\033[H", end="")
                    print(time.strftime("%H:%M:%S"), f"site {gw.site}")
                print(format_paths_table(rows), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.interval)


def cmd_status(args: argparse.Namespace) -> int:
    from wangate.client import Client
    from wangate.rows import GatewayStatus
    from wangate.views import format_status

    with Client(_socket_from(args)) as gw:
        status = GatewayStatus.from_dict(gw.status())
    print(json.dumps(status.to_dict(), indent=2) if args.json else format_status(status))
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from wangate.client import Client
    from wangate.jobs_table import format_jobs_table, job_rows

    with Client(_socket_from(args)) as gw:
        before, started = gw.status(), time.monotonic()
        time.sleep(args.interval)
        after, rows = gw.status(), gw.paths()
        jobs = job_rows(before, after, rows, time.monotonic() - started)
    print(json.dumps(jobs, indent=2) if args.json else format_jobs_table(jobs))
    return 0


def cmd_reset_path(args: argparse.Namespace) -> int:
    from wangate.client import Client

    with Client(_socket_from(args)) as gw:
        gw.reset_path(args.peer, args.path)
    print(f"{args.peer}/{args.path}: connection reset; it reconnects by itself")
    return 0


# ---------------------------------------------------------------------- certs


def cmd_certs(args: argparse.Namespace) -> int:
    from wangate.certs import create_ca, issue_site_certificate

    directory = Path(args.dir)
    if args.certs_command == "ca":
        cert, key = create_ca(directory, force=args.force)
        print(f"site CA: {cert} (key {key}; keep it offline)")
    else:
        cert, key = issue_site_certificate(directory, args.name, force=args.force)
        print(f"site {args.name}: {cert} (key {key})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from wangate.demo import run_demo

    return run_demo(sites=args.sites, paths=args.paths, size_mib=args.size_mib)


def cmd_probe(args: argparse.Namespace) -> int:
    import asyncio

    from wangate.errors import ConfigError
    from wangate.probe.analysis import format_report
    from wangate.probe.net import ProbeOptions, parse_address, probe_report, serve_responder

    if args.serve:
        if args.target:
            raise ConfigError("--serve answers probes: give --listen IP:PORT, not a target")
        idle_s = None if args.forever else args.idle_timeout

        def ready(address: tuple[str, int]) -> None:
            until = "until interrupted" if idle_s is None else f"until {idle_s:g} s without probes"
            print(f"probe responder on {address[0]}:{address[1]}, {until}", flush=True)

        serving = serve_responder(parse_address(args.listen), idle_timeout_s=idle_s, ready=ready)
        return asyncio.run(_until_signalled(serving))
    if not args.target:
        raise ConfigError("wangate probe HOST:PORT (run `wangate probe --serve` on the far side)")
    options = ProbeOptions(
        parse_address(args.target),
        local=args.local,
        duration_s=args.duration,
        rate_cap_bps=args.rate_mbps * 1e6,
        probe_rate_hz=args.probe_rate,
        data_bytes=args.size,
    )
    report = asyncio.run(probe_report(options))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["verdict"]["kind"] == "unusable" else 0


# ----------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wangate", description="Gradient transport gateway between training sites."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the gateway daemon in the foreground")
    run.add_argument("-c", "--config", required=True, help="TOML configuration file")
    run.set_defaults(func=cmd_run, verbose_default=1)

    def target(p: argparse.ArgumentParser) -> None:
        group = p.add_mutually_exclusive_group()
        group.add_argument("-s", "--socket", help="the gateway's Unix socket")
        group.add_argument("-c", "--config", help="read the socket path from this config")

    paths = sub.add_parser("paths", help="measured quality of every path")
    target(paths)
    paths.add_argument("--json", action="store_true", help="JSON rows for scripts")
    paths.add_argument("--watch", action="store_true", help="refresh until interrupted")
    paths.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    paths.set_defaults(func=cmd_paths)

    status = sub.add_parser("status", help="site, peers and message counters")
    target(status)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    jobs = sub.add_parser("jobs", help="per job: bytes, rates, path shares, what waits")
    target(jobs)
    jobs.add_argument("--json", action="store_true")
    jobs.add_argument("--interval", type=float, default=1.0, help="seconds between the reads")
    jobs.set_defaults(func=cmd_jobs)

    reset = sub.add_parser("reset-path", help="close one path's connection (it reconnects)")
    target(reset)
    reset.add_argument("peer")
    reset.add_argument("path")
    reset.set_defaults(func=cmd_reset_path)

    certs = sub.add_parser("certs", help="make a site CA and site certificates")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    ca = certs_sub.add_parser("ca", help="create DIR/ca.pem and DIR/ca.key")
    ca.add_argument("dir")
    ca.add_argument("--force", action="store_true", help="overwrite existing files")
    site = certs_sub.add_parser("site", help="create DIR/NAME.pem and DIR/NAME.key")
    site.add_argument("dir")
    site.add_argument("name")
    site.add_argument("--force", action="store_true", help="overwrite existing files")
    certs.set_defaults(func=cmd_certs)

    demo = sub.add_parser("demo", help="several sites on loopback, real daemons and QUIC")
    demo.add_argument("--sites", type=int, default=3, help="number of sites (2..4)")
    demo.add_argument("--paths", type=int, default=3, help="paths between each pair (1..4)")
    demo.add_argument("--size-mib", type=int, default=32, help="bulk gradient size per pair")
    demo.set_defaults(func=cmd_demo)

    probe = sub.add_parser(
        "probe", help="measure a link before using it (`probe --serve` on the far side)"
    )
    probe.add_argument("target", nargs="?", help="IP:PORT of the far side's responder")
    probe.add_argument("--serve", action="store_true", help="be the far side: answer probes")
    probe.add_argument(
        "--listen", default="0.0.0.0:7444", help="responder address, UDP (0.0.0.0:7444)"
    )
    probe.add_argument(
        "--idle-timeout",
        type=float,
        default=60.0,
        help="responder exits after this many seconds without probes (60)",
    )
    probe.add_argument("--forever", action="store_true", help="responder never exits by itself")
    probe.add_argument("--local", help="bind to this address (picks the route)")
    probe.add_argument("--duration", type=float, default=10.0, help="seconds for both phases (10)")
    probe.add_argument("--rate-mbps", type=float, default=100.0, help="highest rate tried (100)")
    probe.add_argument(
        "--probe-rate", type=float, default=20.0, help="latency probes per second (20)"
    )
    probe.add_argument("--size", type=int, default=1200, help="rate-test datagram bytes (1200)")
    probe.add_argument("--json", action="store_true", help="the report as JSON")
    probe.set_defaults(func=cmd_probe)
    return parser


async def _until_signalled(work: Coroutine[Any, Any, object]) -> int:
    """Run ``work``; SIGINT or SIGTERM cancels it. Returns 0, or 128 + the signal's number.

    Handlers are installed explicitly: a process started with SIGINT ignored (a
    background job of a script) would otherwise never stop on Ctrl-C or ``kill -INT``.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return 128 + received[0] if received else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = args.verbose or getattr(args, "verbose_default", 0)
    _setup_logging(verbose)
    try:
        return int(args.func(args))
    except WangateError as exc:
        print(f"wangate: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
