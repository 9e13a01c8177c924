"""The tag namespace of collective traffic.

Every message a collective sends has a tag starting with ``@c/``; ``Client.send`` refuses
user tags there, so collective traffic and user messages never match each other's
``recv``. A wire tag is ``@c/<kind>/<plan digest>/<index>/<user tag>``: the kind says which
phase, the digest which plan (two sites with different plans never mix data), the index
which chunk. The step travels in the message's own step field.
"""

from __future__ import annotations

from wangate.errors import LocalProtocolError

PREFIX = "@c/"
MAX_TAG_BYTES = 256  # proto/localapi.md
MAX_USER_TAG_BYTES = 200  # leaves room for the prefix, kind, digest and index

KINDS = frozenset({"rs", "ag", "dx", "bc", "br", "jn", "pl", "cp"})


def is_reserved(tag: str) -> bool:
    return tag.startswith(PREFIX)


def check_user_tag(tag: str) -> None:
    """Refuse a user ``send`` tag inside the collective namespace."""
    if is_reserved(tag):
        raise LocalProtocolError(
            f"tag {tag!r} starts with {PREFIX!r}, which is reserved for collectives: "
            "choose another tag"
        )


def check_collective_tag(tag: str) -> None:
    if not isinstance(tag, str) or not tag:
        raise LocalProtocolError("a collective needs a non-empty string tag")
    size = len(tag.encode("utf-8", "surrogatepass"))
    if size > MAX_USER_TAG_BYTES:
        raise LocalProtocolError(
            f"collective tag {tag[:40]!r}... is {size} bytes; at most {MAX_USER_TAG_BYTES}"
        )
    check_user_tag(tag)


def wire_tag(kind: str, digest: str, index: int, tag: str) -> str:
    assert kind in KINDS
    return f"{PREFIX}{kind}/{digest}/{index}/{tag}"
