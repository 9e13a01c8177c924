"""A message that arrived, verified, waiting for a trainer's ``recv``."""

from __future__ import annotations

from dataclasses import dataclass

from wangate.core.buffer import Buffer
from wangate.core.events import MessageReceived
from wangate.core.jobs import DEFAULT_JOB


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
    segment_id: int = 0  # ≥ 1: the trainer's client returns the segment by it
    job: str = DEFAULT_JOB  # the sender's job: only a recv of the same job matches

    @classmethod
    def received(cls, source: str, event: MessageReceived) -> Delivery:
        """What ``source``'s session reported whole and verified, as a delivery."""
        header = event.header
        return cls(
            source=source,
            tag=header.tag,
            step=header.step,
            critical=header.critical,
            meta=header.meta,
            payload=event.payload,
            checksum=header.checksum,
            msg_id=event.msg_id,
            body_bytes=event.body_bytes,
            job=header.job,
        )
