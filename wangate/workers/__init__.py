"""Worker processes: one gateway host uses several cores (``[workers] count``).

``coordinator`` is the daemon's backend with workers (``sending`` stages a message's
stripes, ``receiving`` puts arriving stripes together and delivers them, ``merge``
builds ``paths`` and ``status`` from the workers' reports); ``worker`` is one worker
process; ``pool`` starts and watches them; ``channel`` is the control channel between
them; ``stripes`` cuts messages and puts them back together (pure).
proto/workers.md has the protocol; wangate/net/README.md the drivers a worker runs.
"""
