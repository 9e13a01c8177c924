"""python -m wangate.lab {check,up,selftest,cleanup}"""

from __future__ import annotations

import argparse
import json
import sys
import time

from wangate.errors import WangateError


def _up(args: argparse.Namespace) -> int:
    from wangate.lab.lab import Lab
    from wangate.lab.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    with Lab(scenario, run_id=args.run_id) as lab:
        print(f"scenario {scenario.name}: run {lab.run_id}")
        for site in scenario.sites:
            print(f"  site {site}: ip netns exec {lab.namespace(site)} COMMAND")
            for address in lab.site_addresses(site):
                print(
                    f"    path {address.path} to {address.peer}: bind {address.local}, "
                    f"reach {address.remote} (mtu {address.mtu})"
                )
        if args.gateway:
            lab.start_gateways(args.gateway)
            print(f"  gateways started; configs in {lab.state_dir / 'gateway'}")
        lab.start_timeline()
        print(f"timeline started ({len(scenario.timeline)} changes); Ctrl-C to tear down")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("tearing down")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wangate.lab", description="Emulated WAN between sites in namespaces."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="refuse clearly unless root and /dev/net/tun")
    up = sub.add_parser("up", help="bring a scenario up and hold it until Ctrl-C")
    up.add_argument("scenario", help="file, or name in wangate/lab/scenarios/")
    up.add_argument("--run-id")
    up.add_argument(
        "--gateway",
        help="command run in every site, e.g. "
        "'.venv/bin/wangate run -c {config}' ({config} {site} {socket} {rundir})",
    )
    selftest = sub.add_parser("selftest", help="the emulator's accuracy, rate and CPU use")
    selftest.add_argument("--run-id")
    selftest.add_argument("--json", action="store_true", help="accuracy numbers as JSON only")
    sub.add_parser("cleanup", help="remove namespaces/devices left by crashed runs")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            from wangate.lab.netns import check_environment

            check_environment()
            print("ok: root, /dev/net/tun and iproute2 present")
            return 0
        if args.command == "up":
            return _up(args)
        if args.command == "selftest":
            from wangate.lab import selftest as st

            if args.json:
                print(json.dumps(st.measure_accuracy(args.run_id), indent=2))
            else:
                print(st.run_selftest(args.run_id))
            return 0
        if args.command == "cleanup":
            from wangate.lab.lab import cleanup

            removed = cleanup()
            print("\n".join(removed) if removed else "nothing to clean up")
            return 0
    except WangateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
