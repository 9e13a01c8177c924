"""Replay fuzz corpora through the targets (no atheris needed), optionally under coverage.py.

Usage (from the repository root)::

    .venv/bin/python tests/fuzz/replay.py [--coverage] [--out DIR] [target ...]

Replays ``tests/fuzz/corpus/<target>`` and, with ``--out``, the corpus a campaign grew in
``DIR/<target>/corpus``. Exits 1 if any input raises something other than a
``WangateError``. ``--coverage`` (needs ``pip install coverage``) prints line and branch
coverage of the decoder modules, encoders included, reached by those inputs.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODULES = [
    "wangate/core/frames.py",
    "wangate/core/message.py",
    "wangate/core/inbound.py",
    "wangate/core/coding.py",
    "wangate/core/fec.py",
    "wangate/metrics_http.py",
    "wangate/localapi/protocol.py",
    "wangate/localapi/framing.py",
    "wangate/config/parse.py",
    "wangate/config/reader.py",
    "wangate/config/access.py",
    "wangate/config/tls_material.py",
    "wangate/config/schema.py",
    "wangate/codec/frame.py",
    "wangate/codec/tensor.py",
    "wangate/codec/zstd.py",
    "wangate/codec/dense.py",
    "wangate/codec/int8.py",
    "wangate/codec/int4.py",
    "wangate/codec/float16.py",
    "wangate/codec/blockwise.py",
    "wangate/codec/topk.py",
    "wangate/codec/spec.py",
    "wangate/probe/packets.py",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coverage", action="store_true")
    parser.add_argument("--missing", action="store_true", help="list uncovered lines")
    parser.add_argument("--out", type=Path)
    parser.add_argument("targets", nargs="*")
    args = parser.parse_args()
    cov = None
    if args.coverage:
        import coverage

        cov = coverage.Coverage(
            data_file=None, branch=True, include=[str(REPO / m) for m in MODULES]
        )
        cov.start()
    import targets  # type: ignore[import-not-found]

    from wangate.errors import WangateError

    failures = 0
    for name in args.targets or sorted(targets.TARGETS):
        folders = [HERE / "corpus" / name]
        if args.out is not None:
            folders.append(args.out / name / "corpus")
        inputs = [path for folder in folders if folder.is_dir() for path in folder.iterdir()]
        decoded = 0
        for path in sorted(inputs):
            try:
                targets.TARGETS[name](path.read_bytes())
                decoded += 1
            except WangateError:
                pass
            except Exception:
                failures += 1
                print(f"{name}: {path} raised:", file=sys.stderr)
                traceback.print_exc()
        print(f"{name}: {len(inputs)} inputs, {decoded} decoded, the rest wangate errors")
    if cov is not None:
        cov.stop()
        cov.report(show_missing=args.missing)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
