"""SentFrames: which end-to-end frames a closed connection may have taken with it."""

from __future__ import annotations

from wangate.core.replay import SentFrames


def test_frames_within_the_window_go_again_once_and_other_paths_keep_theirs() -> None:
    frames = SentFrames(window_s=2.0)
    frames.sent("a", b"old", 10.0)
    frames.sent("b", b"other", 10.5)
    frames.sent("a", b"mid", 11.5)
    frames.sent("a", b"new", 12.9)
    assert frames.lost_with("a", 13.0) == b"midnew"  # "old" is 3 s old: it arrived
    assert frames.lost_with("a", 13.0) == b""
    assert frames.lost_with("b", 12.5) == b"other"
    assert frames.lost_with("c", 12.5) == b""
