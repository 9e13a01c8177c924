"""``Buffer``: the bytes-like objects the core takes without copying them.

A payload stays whatever the caller handed over (a trainer's ``bytearray``, a
``memoryview`` of a reassembly buffer) until it is sliced into datagrams.
"""

from __future__ import annotations

Buffer = bytes | bytearray | memoryview
