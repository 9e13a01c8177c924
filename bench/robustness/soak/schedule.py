"""The fault schedule: drawn from the seed alone, the same for the same seed (pure).

Kinds, with what ``target`` and ``duration_s`` mean:

- ``blackhole``: a path drops everything both ways for ``duration_s`` (0.5-5 s);
- ``loss``: a path loses ``loss`` (5-40 %) of its packets both ways for ``duration_s``
  (0.5-5 s), then its own loss again;
- ``stop``: a site's daemon (and its workers) SIGSTOPped for ``duration_s`` (0.5-3 s),
  then SIGCONT;
- ``kill``: a site's daemon SIGKILLed, started again ``duration_s`` (0.5-4 s) later;
- ``kill_worker`` (with workers only): worker ``target`` (``site/w<i>``) SIGKILLed; its
  coordinator starts it again.

Link faults are the lab's timeline (the emulator applies them on time); process faults
are done by the soak itself, one at a time, each at its time or as soon as the one
before is over. A path has one link fault at a time; every fault is over by
``seconds`` less a margin, so the drain starts on healthy links.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from bench.robustness.soak.plan import Topology

LINK_KINDS = ("blackhole", "loss")
PROCESS_KINDS = ("stop", "kill", "kill_worker")
KINDS = LINK_KINDS + PROCESS_KINDS
WEIGHTS = {"blackhole": 3.0, "loss": 2.0, "stop": 2.0, "kill": 1.5, "kill_worker": 2.0}
# how long after a process fault starts the next may start: a restarted daemon needs
# its paths up again (seconds on a busy machine), a stopped one its peers' attention
SETTLE_S = {"stop": 2.0, "kill": 10.0, "kill_worker": 4.0}
END_MARGIN_S = 3.0


@dataclass(frozen=True)
class Fault:
    at_s: float  # from the start of the faulted phase
    kind: str
    target: str
    duration_s: float
    loss: float = 0.0

    @property
    def ends_s(self) -> float:
        return self.at_s + self.duration_s

    def describe(self) -> str:
        what = {
            "blackhole": f"blackhole {self.target} {self.duration_s:.2f} s",
            "loss": f"loss {self.loss:.0%} on {self.target} {self.duration_s:.2f} s",
            "stop": f"SIGSTOP {self.target} {self.duration_s:.2f} s",
            "kill": f"SIGKILL {self.target}, restart {self.duration_s:.2f} s later",
            "kill_worker": f"SIGKILL worker {self.target}",
        }[self.kind]
        return f"t={self.at_s:6.2f} s {what}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def draw_schedule(seed: int, seconds: float, topology: Topology, workers: int = 1) -> list[Fault]:
    """The faults of a run of ``seconds`` (ordered by time)."""
    rng = random.Random(f"soak-faults/{seed}")
    kinds = [k for k in KINDS if k != "kill_worker" or workers >= 2]
    weights = [WEIGHTS[k] for k in kinds]
    paths, sites = topology.path_names(), list(topology.site_names)
    free_at: dict[str, float] = {}  # a path's, or "process" for the one process fault
    faults: list[Fault] = []
    t = rng.uniform(1.0, 3.0)
    while t < seconds - END_MARGIN_S:
        kind = rng.choices(kinds, weights)[0]
        loss = 0.0
        if kind in LINK_KINDS:
            target = key = rng.choice(paths)
            duration = rng.uniform(0.5, 5.0)
            if kind == "loss":
                loss = round(rng.uniform(0.05, 0.40), 3)
            busy_s = duration + 0.5
        else:
            key, site = "process", rng.choice(sites)
            target = site
            duration = 0.0
            if kind == "stop":
                duration = rng.uniform(0.5, 3.0)
            elif kind == "kill":
                duration = rng.uniform(0.5, 4.0)
            else:
                target = f"{site}/w{rng.randrange(workers)}"
            busy_s = duration + SETTLE_S[kind]
        duration = round(duration, 3)
        if free_at.get(key, 0.0) <= t and t + duration <= seconds - END_MARGIN_S:
            faults.append(Fault(round(t, 3), kind, target, duration, loss))
            free_at[key] = t + busy_s
        t += rng.uniform(1.0, 4.0)
    return faults


def timeline(faults: list[Fault], topology: Topology) -> list[dict[str, Any]]:
    """The lab timeline entries of the link faults (scenario schema)."""
    entries: list[dict[str, Any]] = []
    for fault in faults:
        if fault.kind == "blackhole":
            on: dict[str, Any] = {"blackhole": True}
            off: dict[str, Any] = {"blackhole": False}
        elif fault.kind == "loss":
            on, off = {"loss": fault.loss}, {"loss": topology.base_loss(fault.target)}
        else:
            continue
        entries.append({"at_s": fault.at_s, "path": fault.target, "set": on})
        entries.append({"at_s": fault.ends_s, "path": fault.target, "set": off})
    return sorted(entries, key=lambda e: float(e["at_s"]))


def count_by_kind(faults: list[Fault]) -> dict[str, int]:
    counts = Counter(f.kind for f in faults)
    return {kind: counts[kind] for kind in KINDS if counts[kind]}
