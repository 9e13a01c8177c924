"""FEC throughput and the congestion controller on an emulated WAN.

    python -m bench transport fec              # zfec blocks: encode/decode MB/s, overhead
    python -m bench transport fec cc [--scenario loss_1] [--cc reno wangate] [--mib 24]
        # one plain aioquic stream per controller on the lab's emulated path (root)

``cc`` runs bench.runner.transfer's receiver in the destination namespace and its QUIC
sender, with the chosen aioquic congestion controller, in the source namespace.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import zfec

from wangate.core.fec import MAX_SYMBOLS, BlockDecoder, BlockEncoder

# ------------------------------------------------------------------------- FEC


def _timed(run: Callable[[], None], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def bench_fec(k: int, m: int, symbol_bytes: int, blocks: int) -> dict[str, float]:
    data = memoryview(bytes(range(256)) * (k * symbol_bytes * blocks // 256 + 1))
    sources = [
        [data[(b * k + i) * symbol_bytes : (b * k + i + 1) * symbol_bytes] for i in range(k)]
        for b in range(blocks)
    ]
    repair_ids = range(k, k + m)
    encoded: list[list[bytes]] = []

    def encode() -> None:
        encoded.clear()
        for block in sources:
            encoder = BlockEncoder(k, symbol_bytes)
            for index, symbol in enumerate(block):
                encoder.add_source(index, symbol)
            encoded.append(encoder.repairs(repair_ids))

    raw_encoder = zfec.Encoder(k, MAX_SYMBOLS)
    wanted = tuple(repair_ids)

    def encode_raw() -> None:
        for block in sources:
            raw_encoder.encode(tuple(block), wanted)

    def decode() -> None:  # worst case: the first m sources lost
        for block, repairs in zip(sources, encoded, strict=True):
            decoder = BlockDecoder(k, symbol_bytes)
            for index in range(m, k):
                decoder.add(index, block[index])
            for index, symbol in zip(repair_ids, repairs, strict=True):
                decoder.add(index, symbol)
            decoder.recover()

    raw_decoder = zfec.Decoder(k, MAX_SYMBOLS)
    ids = tuple(range(m, k)) + wanted

    def decode_raw() -> None:
        for block, repairs in zip(sources, encoded, strict=True):
            raw_decoder.decode(tuple(block[m:]) + tuple(repairs), ids)

    repeat = 3
    encode()  # warm caches; fills ``encoded`` for decode
    t_encode = _timed(encode, repeat)
    t_encode_raw = _timed(encode_raw, repeat)
    t_decode = _timed(decode, repeat)
    t_decode_raw = _timed(decode_raw, repeat)
    source_mb = k * symbol_bytes * blocks / 1e6
    return {
        "k": k,
        "m": m,
        "symbol_bytes": symbol_bytes,
        "encode_mb_s": source_mb / t_encode,
        "decode_mb_s": source_mb / t_decode,
        "zfec_encode_mb_s": source_mb / t_encode_raw,
        "zfec_decode_mb_s": source_mb / t_decode_raw,
        "python_encode_us_per_block": (t_encode - t_encode_raw) / blocks * 1e6,
        "python_decode_us_per_block": (t_decode - t_decode_raw) / blocks * 1e6,
    }


def run_fec_bench() -> list[dict[str, float]]:
    rows = []
    for symbol_bytes, blocks in ((1200, 2000), (8900, 300), (16, 5000)):
        rows.append(bench_fec(16, 4, symbol_bytes, blocks))
    return rows


def fec_table(rows: list[dict[str, float]]) -> str:
    lines = [
        "| k | m | symbol B | encode MB/s | decode MB/s | zfec enc | zfec dec "
        "| py µs/block enc | py µs/block dec |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['m']} | {r['symbol_bytes']} | {r['encode_mb_s']:.0f} "
            f"| {r['decode_mb_s']:.0f} | {r['zfec_encode_mb_s']:.0f} "
            f"| {r['zfec_decode_mb_s']:.0f} | {r['python_encode_us_per_block']:.1f} "
            f"| {r['python_decode_us_per_block']:.1f} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------- congestion control


def quic_send(argv: list[str]) -> int:
    """bench.runner.transfer's QUIC sender with ``--cc NAME`` as aioquic's controller."""
    import bench.runner.transfer as transfer
    import wangate.net.congestion  # noqa: F401  registers "wangate"

    cc = argv[argv.index("--cc") + 1]
    del argv[argv.index("--cc") : argv.index("--cc") + 2]
    make = transfer._quic_configuration

    def configuration(is_client: bool) -> Any:
        config = make(is_client)
        config.congestion_control_algorithm = cc
        return config

    transfer._quic_configuration = configuration
    return transfer.main(argv)


def run_cc(
    scenario_name: str, controllers: list[str], mib: int, timeout_s: float
) -> list[dict[str, Any]]:
    from wangate.lab.bound import best_path
    from wangate.lab.lab import Lab
    from wangate.lab.scenario import load_scenario

    scenario = load_scenario(scenario_name)
    flow = scenario.flows[0]
    path = best_path(scenario, flow)
    schedule = [(0.0, 1 << 20)] * mib
    results = []
    with Lab(scenario) as lab:
        for offset, cc in enumerate(controllers):
            port = 9300 + offset
            receiver = lab.run_in(
                flow.dst,
                [
                    sys.executable,
                    "-m",
                    "bench.runner.transfer",
                    "recv",
                    "--proto",
                    "quic",
                    "--bind",
                    f"{path.address_of(flow.dst)}:{port}",
                    "--messages",
                    str(mib),
                ],
                stdout=subprocess.PIPE,
            )
            assert receiver.stdout is not None
            receiver.stdout.readline()
            lab.start_timeline()
            sender = lab.run_in(
                flow.src,
                [
                    sys.executable,
                    "-m",
                    "bench.transport.fec",
                    "--cc",
                    cc,
                    "send",
                    "--proto",
                    "quic",
                    "--bind",
                    path.address_of(flow.src),
                    "--to",
                    f"{path.address_of(flow.dst)}:{port}",
                    "--schedule",
                    json.dumps(schedule),
                ],
                stdout=subprocess.PIPE,
            )
            try:
                sent = json.loads(sender.communicate(timeout=timeout_s)[0] or b"{}")
            except subprocess.TimeoutExpired:
                sender.kill()
                sender.communicate()
                sent = {}
            if not sent:
                receiver.terminate()
            out = receiver.communicate(timeout=10)[0]
            completed = json.loads(out)["completed"] if out else []
            started = float(sent.get("started", 0.0))
            row: dict[str, Any] = {"cc": cc, "messages": len(completed), "mib": mib}
            if completed and started:
                elapsed = completed[-1] - started
                row["time_s"] = elapsed
                row["goodput_mbps"] = len(completed) * (1 << 20) * 8 / elapsed / 1e6
            results.append(row)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench transport fec")
    sub = parser.add_subparsers(dest="command")
    cc = sub.add_parser("cc", help="plain aioquic stream per congestion controller (lab, root)")
    cc.add_argument("--scenario", default="loss_1")
    cc.add_argument("--cc", nargs="+", default=["reno", "wangate"])
    cc.add_argument("--mib", type=int, default=24)
    cc.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.command == "cc":
        rows = run_cc(args.scenario, args.cc, args.mib, args.timeout_s)
        for row in rows:
            print(json.dumps(row))
        return 0
    print(fec_table(run_fec_bench()))
    return 0


if __name__ == "__main__":  # the sender of ``cc`` inside a site's namespace
    sys.exit(quic_send(sys.argv[1:]))
