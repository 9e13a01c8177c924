"""Every message's outcome, classified; the invariants of a soak (pure).

A message is what a sender tried to send (``Sent``: every attempt, accepted or not);
a take is what a receiver got from ``recv`` (``Take``). The sender's outcome is one of

- ``taken``: ``wait`` returned (a trainer at the peer took it);
- ``failed``: the client raised a wangate error that says it will not be delivered
  (``MessageFailed`` from ``wait``; ``PeerUnreachable``, ``DeadlineExceeded`` or
  another refusal from ``send``), with the reason;
- ``unknown``: the sender's own gateway was lost (``GatewayUnavailable``: its daemon
  was killed) after the message may have been accepted, so the sender cannot learn
  its outcome (a gateway that restarts forgets what it sent, proto/delivery.md);
- None: no outcome by the end of the drain.

Each message then falls in exactly one class:

| class | takes | sender | invariant |
|---|---|---|---|
| ``intact`` | one, intact | taken | holds |
| ``intact_sender_lost`` | one, intact | unknown | holds |
| ``taken_reported_failed`` | one, intact | failed, saying it may have been taken | holds (1) |
| ``failed`` | none | failed or unknown | holds, counted by reason |
| ``taken_and_failed`` | one, intact | failed for another reason | **violated** |
| ``duplicate`` | two or more, intact | any | **violated** |
| ``corrupt`` | any not intact | any | **violated** |
| ``phantom`` | none | taken | **violated** |
| ``unaccounted`` | any | None | **violated** |

(1) proto/delivery.md, "Limits": a restart of the receiving gateway before the take's
confirmation reached the sender makes the sender report a taken message failed, and so
does the receiver going silent, or the message's deadline passing, after the sender
sent every byte and before their acks came (the failure says a trainer may have taken it).

A take naming no message that was sent (or no header at all) is ``corrupt`` too.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

OK_CLASSES = ("intact", "intact_sender_lost", "taken_reported_failed", "failed")
BAD_CLASSES = ("taken_and_failed", "duplicate", "corrupt", "phantom", "unaccounted")
RESTARTED = "receiver restarted"
ALL_SENT = "peer unreachable (all of it sent)"
DEADLINE_ALL_SENT = "deadline passed (all of it sent)"
# the failures that say the message may have been taken
MAYBE_TAKEN = (
    f"{RESTARTED} (in its inbox)",
    f"{RESTARTED} (mid-message)",
    ALL_SENT,
    DEADLINE_ALL_SENT,
)
MiB = 1 << 20
RSS_GROWTH_MIB = 20.0
RSS_GROWTH_SHARE = 0.25


@dataclass
class Sent:
    flow: str
    step: int
    size: int
    critical: bool = False
    outcome: str | None = None  # "taken", "failed", "unknown" or None
    reason: str = ""  # a short key: what kind of failure
    detail: str = ""  # the error's own words
    msg_id: int | None = None


@dataclass(frozen=True)
class Take:
    flow: str  # the flow whose receiver took it
    step: int | None  # the step its header names; None: no header
    intact: bool
    detail: str = ""


_REASONS = (  # MessageFailed's words -> a reason key
    (re.compile(r"restarted with it in its inbox"), f"{RESTARTED} (in its inbox)"),
    (re.compile(r"restarted mid-message"), f"{RESTARTED} (mid-message)"),
    (re.compile(r"deadline.*may have taken it"), DEADLINE_ALL_SENT),
    (re.compile(r"may have taken it"), ALL_SENT),
    (re.compile(r"unreachable"), "peer unreachable"),
    (re.compile(r"deadline"), "deadline passed"),
    (re.compile(r"rejected it"), "rejected by the peer"),
)


def reason_of(kind: str, code: str, text: str, during: str) -> str:
    """A reason key for an error of class ``kind`` (with ``code``) raised by ``during``
    ("send" or "wait")."""
    if kind == "GatewayUnavailable":
        return "sender's gateway lost"
    if kind == "PeerUnreachable":
        return f"peer unreachable at {during}"
    if kind == "DeadlineExceeded":
        return f"deadline at {during}"
    if kind == "MessageFailed":
        for pattern, key in _REASONS:
            if pattern.search(text):
                return key
        return "failed (other)"
    return f"{during}: {code or kind}"


@dataclass
class Verdict:
    sent: int = 0
    accepted: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    taken_failed_by_reason: dict[str, int] = field(default_factory=dict)
    taken_intact: int = 0  # taken exactly once, intact, whatever the sender learned
    takes: int = 0
    critical: int = 0
    bytes_taken: int = 0
    violations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def classify(sent: Sent, takes: list[Take]) -> str:
    if any(not t.intact for t in takes):
        return "corrupt"
    if sent.outcome is None:
        return "unaccounted"
    if len(takes) > 1:
        return "duplicate"
    if len(takes) == 1:
        if sent.outcome in ("taken", "unknown"):
            return "intact" if sent.outcome == "taken" else "intact_sender_lost"
        return "taken_reported_failed" if sent.reason in MAYBE_TAKEN else "taken_and_failed"
    return "phantom" if sent.outcome == "taken" else "failed"


def check(sent: list[Sent], takes: list[Take]) -> Verdict:
    """Classify every message; a violation for each message in a bad class and for each
    take of no message sent."""
    verdict = Verdict(sent=len(sent), takes=len(takes))
    by_message: dict[tuple[str, int], list[Take]] = {}
    for take in takes:
        by_message.setdefault((take.flow, take.step if take.step is not None else -1), [])
        by_message[(take.flow, take.step if take.step is not None else -1)].append(take)
    classes: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    taken_failed: Counter[str] = Counter()
    known = set()
    for message in sent:
        key = (message.flow, message.step)
        known.add(key)
        got = by_message.get(key, [])
        kind = classify(message, got)
        classes[kind] += 1
        verdict.accepted += message.msg_id is not None
        verdict.critical += message.critical
        if kind == "failed":
            failed[message.reason] += 1
        elif kind in ("taken_reported_failed", "taken_and_failed"):
            taken_failed[message.reason] += 1
        if len(got) == 1 and got[0].intact:
            verdict.taken_intact += 1
            verdict.bytes_taken += message.size
        if kind in BAD_CLASSES:
            verdict.violations.append(
                {
                    "class": kind,
                    "flow": message.flow,
                    "step": message.step,
                    "size": message.size,
                    "msg_id": message.msg_id,
                    "outcome": message.outcome,
                    "reason": message.reason,
                    "detail": message.detail,
                    "takes": [asdict(t) for t in got],
                }
            )
    for key, got in sorted(by_message.items()):
        if key not in known:
            classes["corrupt"] += 1
            verdict.violations.append(
                {
                    "class": "corrupt",
                    "flow": key[0],
                    "step": got[0].step,
                    "detail": "taken, but no such message was sent",
                    "takes": [asdict(t) for t in got],
                }
            )
    verdict.classes = {k: classes[k] for k in OK_CLASSES + BAD_CLASSES}
    verdict.failed_by_reason = dict(sorted(failed.items()))
    verdict.taken_failed_by_reason = dict(sorted(taken_failed.items()))
    return verdict


def rss_flat(start_mib: float, end_mib: float) -> bool:
    """Growth below ``RSS_GROWTH_MIB`` and below ``RSS_GROWTH_SHARE`` of the start."""
    growth = end_mib - start_mib
    return growth < RSS_GROWTH_MIB and growth < RSS_GROWTH_SHARE * start_mib


def rss_violations(rss: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One violation per site whose daemon (with its workers) grew past the bound;
    ``rss`` maps a site to ``{"start_mib", "end_mib"}``."""
    return [
        {
            "class": "rss",
            "site": site,
            "start_mib": values["start_mib"],
            "end_mib": values["end_mib"],
        }
        for site, values in sorted(rss.items())
        if not rss_flat(values["start_mib"], values["end_mib"])
    ]
