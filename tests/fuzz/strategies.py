"""Hypothesis strategies shared by the tests/test_fuzz_*.py property tests."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

CORPUS = Path(__file__).resolve().parent / "corpus"


def seeds(target: str) -> list[bytes]:
    """The seed corpus of ``target`` (valid inputs made from the golden vectors)."""
    return [path.read_bytes() for path in sorted((CORPUS / target).iterdir())]


@st.composite
def mutated(draw: st.DrawFn, originals: list[bytes], max_edits: int = 4) -> bytes:
    """One of ``originals`` with a few byte-level edits, as a mutation fuzzer makes them."""
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(0, max_edits))):
        kind = draw(st.sampled_from(("set", "flip", "insert", "delete", "truncate", "extend")))
        pos = draw(st.integers(0, len(data)))
        if kind == "set" and pos < len(data):
            data[pos] = draw(st.sampled_from((0x00, 0x01, 0x7F, 0x80, 0xFF)))
        elif kind == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=16))
    return bytes(data)
