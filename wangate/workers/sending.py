"""The sending coordinator's stripes: a message in shared memory, cut into stripes,
each tracked until its worker confirms it (proto/workers.md, "Stripes").

A payload that came in the trainer's own segment is not copied: the workers map
their stripes of that segment, which stays open until the message is finished. The
coordinator reads it once for the stripes' CRC-32s (the one checksum pass on the way
in; combined, they must give the checksum the trainer declared). A payload that came
in-band (small) is staged: each stripe copied into a sealed memfd, its CRC-32 taken
over the copy.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from wangate.checksum import crc32, crc32_combine
from wangate.core.jobs import DEFAULT_JOB
from wangate.core.message import MAX_META_BYTES, MessageHeader
from wangate.errors import ErrorCode, GatewayError, LocalProtocolError
from wangate.service import Submission
from wangate.shm import SIZE_SEALS, new_segment, seal
from wangate.workers.channel import UNKNOWN_HOLDER
from wangate.workers.stripes import DESCRIPTOR_BYTES, stripe_ranges

STRIPE_NAME = "wangate-stripe"  # what /proc/PID/fd shows


@dataclass
class OutMessage:
    """A message being sent."""

    peer: str
    msg_id: int
    tag: str
    step: int
    critical: bool
    total: int
    started_at: float
    deadline_at: float | None
    deadline_s: float | None  # as the trainer gave it
    left: int  # stripes not confirmed yet
    finished: bool = False
    # the trainer's segment the stripes are sent from (descriptor, payload offset), and
    # the payload's mapping, which keeps that descriptor open until the message is done
    segment: tuple[int, int] | None = None
    payload: memoryview | None = None
    job: str = DEFAULT_JOB
    holder: int = UNKNOWN_HOLDER  # the peer's coordinator its stripes reached

    def reached(self, holder: int) -> bool:
        """Note that a stripe reached (was confirmed by), or may have reached (failed
        after it was sent), the peer's coordinator ``holder``; False if an earlier one
        reached another. Then the peer restarted between them: the new instance has only
        some of the stripes, or may deliver a second copy of one the old instance took,
        so the message must fail, not count as delivered."""
        if holder == UNKNOWN_HOLDER:
            return True
        if self.holder == UNKNOWN_HOLDER:
            self.holder = holder
        return self.holder == holder


@dataclass
class Stripe:
    sid: int
    message: OutMessage
    offset: int
    length: int
    # the staged copy, kept until confirmed (a worker that exits needs it again); None:
    # the stripe is sent from the message's segment
    fd: int | None
    meta: bytes
    checksum: int
    worker: int = -1
    attempts: int = 0
    sends: int = 0  # to a worker, restarts included
    first_failure: str | None = None  # why its first send failed: what the message says
    acked: bool = False  # the peer had it whole once: no longer counts as waiting

    def source(self) -> tuple[int, int]:
        """The descriptor a worker maps this stripe from (not its own: dup it) and the
        stripe's offset in it."""
        if self.fd is not None:
            return self.fd, 0
        assert self.message.segment is not None
        fd, offset = self.message.segment
        return fd, offset + self.offset


def stage_payload(
    submission: Submission, meta: bytes, view: memoryview
) -> list[tuple[int, int, int | None, int]]:
    """(offset, length, sealed segment, CRC-32) of each stripe of ``view``; the segment
    is None where ``submission`` names the trainer's segment (its stripes are sent
    from it).

    Raises ``GatewayError``: ``bad_request`` for what a worker's session would refuse
    (a bad tag, a meta too long for the stripe descriptor beside it), ``checksum`` when
    the bytes do not give the declared checksum; nothing is kept then.
    """
    try:
        MessageHeader(
            submission.tag, submission.step, submission.critical, 0, meta, submission.job
        ).encode()
    except LocalProtocolError as exc:
        raise GatewayError(str(exc), code=ErrorCode.BAD_REQUEST) from None
    if len(meta) + DESCRIPTOR_BYTES > MAX_META_BYTES:
        raise GatewayError(
            f"tensor description over {MAX_META_BYTES - DESCRIPTOR_BYTES} bytes "
            "(with [workers], a stripe descriptor shares the limit)",
            code=ErrorCode.BAD_REQUEST,
        )
    staged: list[tuple[int, int, int | None, int]] = []
    crc = zlib.crc32(meta)
    in_segment = submission.segment is not None
    try:
        for offset, length in stripe_ranges(view.nbytes):
            part = view[offset : offset + length]
            if in_segment:
                fd, part_crc = None, crc32(part)
            else:
                fd, part_crc = _stage(part)
            staged.append((offset, length, fd, part_crc))
            crc = crc32_combine(crc, part_crc, length)
    except OSError as exc:
        _close_fds(fd for _, _, fd, _ in staged)
        raise GatewayError(f"cannot stage the payload in shared memory: {exc}") from None
    if crc != submission.checksum & 0xFFFFFFFF:
        _close_fds(fd for _, _, fd, _ in staged)
        raise GatewayError(
            f"send {submission.tag!r} (step {submission.step}) to {submission.peer}: the "
            f"payload's checksum is {crc:08x}, the request declares {submission.checksum:08x}",
            code=ErrorCode.CHECKSUM,
        )
    return staged


def _stage(part: memoryview) -> tuple[int, int]:
    """A sealed segment holding a copy of ``part``, and the copy's CRC-32."""
    length = part.nbytes
    if length == 0:
        fd = os.memfd_create(STRIPE_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        seal(fd, SIZE_SEALS)
        return fd, 0
    fd, mapping = new_segment(length, STRIPE_NAME)
    try:
        copy = memoryview(mapping)
        copy[:length] = part
        crc = crc32(copy[:length])  # of the copy: what the workers send
        copy.release()
        mapping.close()
        seal(fd, SIZE_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd, crc


def _close_fds(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)
