"""``wangate probe``: measure a candidate WAN link before a gateway uses it.

``packets`` (the UDP format, ``proto/probe.md``), ``responder`` (the far side's
logic), ``trains`` (what one rate train shows), ``rate`` (the rate phase's plan and
capacity), ``loss`` (a loss rate with its interval), ``analysis`` (statistics, verdict,
report) are pure; ``net`` is the asyncio shell.
"""
