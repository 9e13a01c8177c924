"""A randomized, seeded fault soak in the WAN lab, checked against invariants.

    python -m bench robustness soak [--seed 1] [--seconds 180] [--workers 2]
        [--sites 3] [--paths 2] [--tree REV] [--json]

Sites are lab namespaces joined by the userspace link emulator; every pair of sites has
``--paths`` paths. Trainers (threads of this process, ``wangate.Client``) send every
other site messages of mixed sizes (1 KiB to 8 MiB, some critical, some with a
deadline), each with its own step and a payload derived from the seed, the flow and
the step; receivers take everything and check it byte for byte. After a warm-up the
fault schedule, drawn from the seed, plays: path blackholes (both directions), loss
bursts, SIGSTOP/SIGCONT of a daemon, SIGKILL and restart of a daemon, and with
``--workers 2`` SIGKILL of a worker process (its coordinator starts it again). Then a
drain, and the checker: every message is taken intact exactly once or failed at its
sender with a reason; no duplicate, nothing corrupt, nothing unaccounted for; each
daemon's RSS at the end within 20 MiB and 25 % of its RSS after the warm-up.

| module | what |
|---|---|
| ``plan.py`` | the lab's sites and paths, each message's size, flags and payload (pure) |
| ``schedule.py`` | the fault schedule drawn from the seed (pure) |
| ``checker.py`` | each message's outcome classified, the invariants (pure) |
| ``trainers.py`` | the sending and receiving threads |
| ``inject.py`` | signals to daemons and workers, restarts, RSS |
| ``run.py`` | one run: the lab, the daemons of a tree, warm-up, faults, drain |
| ``cli.py``, ``report.py`` | the command, its tables and records (``results/soak/``) |
"""
