"""Convergence under compression: a numpy MLP trained with its gradients passed through each
codec (with and without error feedback), against uncompressed training.

Run: .venv/bin/python -m bench codecs convergence [--steps 4000] [--seeds 3]

Task: teacher-student classification. A fixed random teacher (64-32-10, tanh) labels
Gaussian inputs; a student MLP (64-128-128-10, ReLU, 26k parameters) learns it with SGD and
momentum, batch 128, a fresh batch each step (no overfitting, so the test loss measures
optimisation). Every gradient goes encode -> decode before the update, chosen per tensor by
a CodecPolicy (tensors under 4 KiB, the biases, stay uncompressed). Seeds fix teacher,
batches and initialisation, so runs differ only by the codec.
"""

from __future__ import annotations

import os

# The matrices are tiny: BLAS threads only spin against each other (and the codecs) here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import time
from dataclasses import dataclass

import numpy as np

from wangate.codec import CodecPolicy, ErrorFeedback, decode_tensor, encode_tensor

INPUTS, HIDDEN, CLASSES, TEACHER_HIDDEN = 64, 128, 10, 32
TEST, BATCH = 8192, 128
PEAK_LEARNING_RATE, MOMENTUM = 0.1, 0.9

# (spec, mode): "ef" error feedback, momentum at the receiver; "off" no error feedback;
# "ef+mc" error feedback on the sender's momentum (momentum correction and factor masking,
# as in Deep Gradient Compression), the receiver applies what arrives.
RUNS = (
    ("none", "off"),
    ("fp16", "ef"),
    ("bf16", "ef"),
    ("int8", "ef"),
    ("int8", "off"),
    ("int4", "ef"),
    ("split:0.01/int8", "ef"),
    ("split:0.05/int4", "ef"),
    ("topk:0.01", "ef"),
    ("topk:0.01", "ef+mc"),
    ("topk:0.01", "off"),
    ("topk:0.01/int8+zstd", "ef+mc"),
    ("topk:0.1", "ef"),
    ("topk:0.1", "off"),
)


@dataclass(frozen=True)
class Task:
    teacher_hidden: np.ndarray
    teacher_out: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((count, INPUTS)).astype(np.float32)
        return x, label(self.teacher_hidden, self.teacher_out, x)


def label(hidden: np.ndarray, out: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.argmax(np.tanh(x @ hidden) @ out, axis=1)


def make_task(seed: int) -> Task:
    rng = np.random.default_rng(1000 + seed)
    hidden = (rng.standard_normal((INPUTS, TEACHER_HIDDEN)) / np.sqrt(INPUTS)).astype(np.float32)
    scale = 3 / np.sqrt(TEACHER_HIDDEN)
    out = (rng.standard_normal((TEACHER_HIDDEN, CLASSES)) * scale).astype(np.float32)
    test_x = rng.standard_normal((TEST, INPUTS)).astype(np.float32)
    return Task(hidden, out, test_x, label(hidden, out, test_x))


def init_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2000 + seed)

    def he(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {
        "layer1.weight": he(INPUTS, HIDDEN),
        "layer1.bias": np.zeros(HIDDEN, np.float32),
        "layer2.weight": he(HIDDEN, HIDDEN),
        "layer2.bias": np.zeros(HIDDEN, np.float32),
        "layer3.weight": he(HIDDEN, CLASSES),
        "layer3.bias": np.zeros(CLASSES, np.float32),
    }


def forward_loss(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, want_grads: bool
) -> tuple[float, float, dict[str, np.ndarray]]:
    """(mean cross-entropy, accuracy, gradients)."""
    h1 = np.maximum(x @ params["layer1.weight"] + params["layer1.bias"], 0)
    h2 = np.maximum(h1 @ params["layer2.weight"] + params["layer2.bias"], 0)
    logits = h2 @ params["layer3.weight"] + params["layer3.bias"]
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    rows = np.arange(y.size)
    loss = float(-np.log(probs[rows, y] + 1e-12).mean())
    accuracy = float((probs.argmax(axis=1) == y).mean())
    if not want_grads:
        return loss, accuracy, {}
    d3 = probs
    d3[rows, y] -= 1
    d3 /= y.size
    d2 = (d3 @ params["layer3.weight"].T) * (h2 > 0)
    d1 = (d2 @ params["layer2.weight"].T) * (h1 > 0)
    grads = {
        "layer3.weight": h2.T @ d3,
        "layer3.bias": d3.sum(axis=0),
        "layer2.weight": h1.T @ d2,
        "layer2.bias": d2.sum(axis=0),
        "layer1.weight": x.T @ d1,
        "layer1.bias": d1.sum(axis=0),
    }
    return loss, accuracy, {name: g.astype(np.float32) for name, g in grads.items()}


@dataclass(frozen=True)
class RunResult:
    test_loss: float
    test_accuracy: float
    wire_bytes_per_step: float


def train(task: Task, seed: int, spec: str, mode: str, steps: int) -> RunResult:
    params = init_params(seed)
    velocity = {name: np.zeros_like(p) for name, p in params.items()}
    policy = CodecPolicy(default=spec, min_lossy_bytes=4096)
    feedback = ErrorFeedback() if mode != "off" else None
    at_sender = mode == "ef+mc"
    batches = np.random.default_rng(3000 + seed)
    wire_bytes = 0
    for step in range(steps):
        # Cosine decay to zero: the final loss reflects where training settles, not SGD noise.
        learning_rate = PEAK_LEARNING_RATE * 0.5 * (1 + np.cos(np.pi * step / steps))
        x, y = task.sample(batches, BATCH)
        _, _, grads = forward_loss(params, x, y, True)
        for name, grad in grads.items():
            if at_sender:
                velocity[name] *= MOMENTUM
                velocity[name] += grad
                grad = velocity[name]
            chosen = policy.choose(name, grad.nbytes, dtype=grad.dtype)
            encoded = encode_tensor(grad, chosen, feedback=feedback, key=("peer", name))
            wire_bytes += len(encoded.meta) + memoryview(encoded.payload).nbytes
            received = decode_tensor(encoded.meta, encoded.payload)
            if at_sender:
                if chosen.startswith("topk"):
                    velocity[name][received != 0] = 0  # momentum factor masking
                params[name] -= learning_rate * received
            else:
                velocity[name] *= MOMENTUM
                velocity[name] += received
                params[name] -= learning_rate * velocity[name]
    loss, accuracy, _ = forward_loss(params, task.test_x, task.test_y, False)
    return RunResult(loss, accuracy, wire_bytes / steps)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench codecs convergence", description=__doc__)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated specs to run (and none)")
    args = parser.parse_args(argv)
    wanted = {"none", *args.only.split(",")} if args.only else None
    tasks = [make_task(seed) for seed in range(args.seeds)]
    started = time.perf_counter()
    results: dict[tuple[str, str], list[RunResult]] = {}
    for spec, mode in RUNS:
        if wanted is not None and spec not in wanted:
            continue
        results[(spec, mode)] = [
            train(tasks[seed], seed, spec, mode, args.steps) for seed in range(args.seeds)
        ]
    baseline = [r.test_loss for r in results[("none", "off")]]
    raw_bytes = results[("none", "off")][0].wire_bytes_per_step
    print(
        f"Teacher-student MLP (26k parameters), SGD+momentum (cosine decay), {args.steps} steps,"
        f" batch {BATCH}, {args.seeds} seeds; test set {TEST} samples. 'vs none': mean and"
        " spread of the per-seed change in test loss against uncompressed.\n"
    )
    print("| codec | feedback | test loss | vs none | test accuracy | bytes/step | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (spec, mode), runs in results.items():
        loss = float(np.mean([r.test_loss for r in runs]))
        change = [100 * (r.test_loss / b - 1) for r, b in zip(runs, baseline, strict=True)]
        accuracy = float(np.mean([r.test_accuracy for r in runs]))
        sent = runs[0].wire_bytes_per_step
        print(
            f"| {spec} | {mode} | {loss:.4f} | {np.mean(change):+.1f}% ± {np.std(change):.1f} | "
            f"{100 * accuracy:.1f}% | {sent:,.0f} | {raw_bytes / sent:.1f} |"
        )
    print(f"\n({time.perf_counter() - started:.0f} s)")
