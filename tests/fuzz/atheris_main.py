"""The shared body of the atheris harnesses: instrument wangate, fuzz one target.

Only wangate's own errors may escape a decoder, so a ``WangateError`` ends an input
normally; anything else (an assertion of a broken round trip included) is a crash that
libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

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
