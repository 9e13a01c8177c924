"""End-to-end control frames a path's stream carried lately, to send again elsewhere.

Frames about whole messages (``MessagesDone``, ``MessagesTaken``, ``MessageRejected``,
``RepairRequested``) go once, on one path's reliable stream. A connection that closes
takes with it what it had not yet delivered, and nothing else would say it: a sender
would never hear that its message was taken. So the frames a path carried within the
last ``window_s`` go again on another path when it goes down. Each of them means the
same the second time (the peer finds the message settled already), so a duplicate costs
only its bytes.
"""

from __future__ import annotations

from collections import deque
from typing import Final

# Longer than a path's silence takes to be declared down (0.5 s) plus a round trip:
# what was sent before that was delivered or the stream would have stalled the path
REPLAY_WINDOW_S: Final = 2.0
MAX_REPLAY_FRAMES: Final = 4096  # per path: frames batch many messages' ids each


class SentFrames:
    """Per path, the end-to-end frames sent on it within the window (encoded)."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S) -> None:
        self.window_s = window_s
        self._sent: dict[str, deque[tuple[float, bytes]]] = {}

    def sent(self, path: str, frames: bytes, now: float) -> None:
        recent = self._sent.get(path)
        if recent is None:
            recent = self._sent[path] = deque(maxlen=MAX_REPLAY_FRAMES)
        self._expire(recent, now)
        recent.append((now, frames))

    def lost_with(self, path: str, now: float) -> bytes:
        """The frames ``path`` carried within the window; forgotten here."""
        recent = self._sent.pop(path, None)
        if recent is None:
            return b""
        self._expire(recent, now)
        return b"".join(frames for _, frames in recent)

    def _expire(self, recent: deque[tuple[float, bytes]], now: float) -> None:
        while recent and now - recent[0][0] > self.window_s:
            recent.popleft()
