"""Codec throughput and compression ratio on 64 MiB of heavy-tailed float32 gradients.

Run: .venv/bin/python -m bench codecs speed [--mib 64] [--repeat 3]
Prints Markdown tables: single-thread MB/s (of float32 input) for encode, decode and encode
with error feedback, the compression ratio (input bytes over meta + payload bytes) and the
worst error relative to the largest magnitude; then how the codecs share the GIL.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from wangate.codec import ErrorFeedback, decode_tensor, encode_tensor

SPECS = (
    "none",
    "zstd:1",
    "zstd",
    "fp16",
    "bf16",
    "int8",
    "int4",
    "topk:0.01",
    "topk:0.01/int8",
    "split:0.01/int8",
    "split:0.05/int4",
    "fp16+zstd",
    "int8+zstd",
    "int4+zstd",
    "topk:0.01/int8+zstd",
    "split:0.01/int8+zstd",
)


def gradient_like(elements: int, seed: int = 0) -> np.ndarray:
    """Student-t (3 degrees of freedom) scaled like a gradient: heavy tails, mostly small."""
    rng = np.random.default_rng(seed)
    return (rng.standard_t(3.0, size=elements) * 1e-3).astype(np.float32)


def best_seconds(run: object, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


def two_thread_rate(x: np.ndarray, spec: str) -> float:
    """MB/s of input encoded by two threads at once, each on its own copy."""
    copies = [x, x.copy()]
    barrier = threading.Barrier(3)

    def work(array: np.ndarray) -> None:
        barrier.wait()
        encode_tensor(array, spec)

    threads = [threading.Thread(target=work, args=(c,)) for c in copies]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return 2 * x.nbytes / 1e6 / (time.perf_counter() - start)


def python_loop_rate(duration_s: float) -> float:
    """Iterations per second of a pure-Python loop: how much GIL time the caller gets."""
    count = 0
    deadline = time.perf_counter() + duration_s
    while time.perf_counter() < deadline:
        for _ in range(1000):
            count += 1
    return count / duration_s


def python_share_beside_worker(x: np.ndarray, spec: str, duration_s: float = 1.0) -> float:
    """Python loop rate while a worker thread encodes without pause, over the rate alone."""
    alone = python_loop_rate(duration_s)
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            encode_tensor(x, spec)

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(0.05)
    beside = python_loop_rate(duration_s)
    stop.set()
    thread.join()
    return beside / alone


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench codecs speed", description=__doc__)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--specs", default=",".join(SPECS))
    args = parser.parse_args(argv)
    x = gradient_like(args.mib * (1 << 20) // 4)
    megabytes = x.nbytes / 1e6
    print(f"Input: {args.mib} MiB float32, Student-t(3) x 1e-3, best of {args.repeat}\n")
    print("| codec | encode MB/s | decode MB/s | encode+EF MB/s | ratio | max abs err / max abs |")
    print("|---|---:|---:|---:|---:|---:|")
    for spec in args.specs.split(","):
        encoded = encode_tensor(x, spec)
        encode_s = best_seconds(lambda spec=spec: encode_tensor(x, spec), args.repeat)
        decode_s = best_seconds(lambda e=encoded: decode_tensor(e.meta, e.payload), args.repeat)
        feedback = ErrorFeedback()
        ef_s = best_seconds(
            lambda spec=spec, fb=feedback: encode_tensor(x, spec, feedback=fb, key="g"), args.repeat
        )
        decoded = decode_tensor(encoded.meta, encoded.payload)
        sent = len(encoded.meta) + memoryview(encoded.payload).nbytes
        error = float(np.abs(decoded - x).max() / np.abs(x).max())
        print(
            f"| {spec} | {megabytes / encode_s:.0f} | {megabytes / decode_s:.0f} | "
            f"{megabytes / ef_s:.0f} | {x.nbytes / sent:.2f} | {error:.2e} |"
        )
    print("\nThreads (GIL): two threads encoding at once, and the speed left to a pure-Python")
    print("thread while a worker thread encodes without pause (1.00 = untouched):\n")
    print("| codec | 1 thread MB/s | 2 threads MB/s | scaling | Python thread beside worker |")
    print("|---|---:|---:|---:|---:|")
    for spec in ("fp16", "int8", "topk:0.01", "int8+zstd", "zstd"):
        single = megabytes / best_seconds(lambda spec=spec: encode_tensor(x, spec), args.repeat)
        double = max(two_thread_rate(x, spec) for _ in range(args.repeat))
        share = python_share_beside_worker(x, spec)
        print(f"| {spec} | {single:.0f} | {double:.0f} | {double / single:.2f}x | {share:.2f} |")
