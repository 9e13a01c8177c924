"""The shared body of the atheris harnesses: instrument wangate, fuzz one target.

Only wangate's own errors may escape a decoder, so a ``WangateError`` ends an input
normally; anything else (an assertion of a broken round trip included) is a crash that
libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import os
import sys


def main(target_name: str) -> None:
    import atheris

    # Only wangate is instrumented: coverage of numpy or msgpack internals would steer
    # the fuzzer away from our own branches and slow every execution.
    with atheris.instrument_imports(include=["wangate"]):
        import targets  # type: ignore[import-not-found]

    def test_one_input(data: bytes) -> None:
        targets.run(target_name, data)

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


def main_native(target_name: str) -> None:
    """The same for a target in the engine's C code (fuzz_engine_*.py). Built with
    coverage (README.md), the engine needs libFuzzer's symbols, which atheris loads when
    Fuzz() starts: they are made global then, and the engine is imported by the first
    input. Built normally, the harness runs without its coverage."""
    import atheris
    import targets  # type: ignore[import-not-found]

    def test_one_input(data: bytes) -> None:
        targets.run(target_name, data)

    atheris.Setup(sys.argv, test_one_input)
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
    atheris.Fuzz()
