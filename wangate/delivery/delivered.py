"""A message that arrived, verified, waiting for a trainer's ``recv``."""

from __future__ import annotations

from dataclasses import dataclass

from wangate.core.buffer import Buffer


@dataclass(frozen=True)
class Delivery:
    """A message that arrived, verified, waiting for a trainer's ``recv``."""

    source: str
    tag: str
    step: int
    critical: bool
    meta: bytes
    payload: Buffer
    checksum: int
    msg_id: int = 0  # the sending gateway's id for it; 0 for messages within the site
    body_bytes: int = 0  # the message body the session counted (header too): credit to release
    # the sealed shared-memory segment that holds the body (the payload ends it), now
    # the delivery's: handed to a trainer that takes segments, else closed
    segment_fd: int | None = None
