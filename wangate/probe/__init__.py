"""``wangate probe``: measure a candidate WAN link before a gateway uses it.

``packets`` (the UDP format, ``proto/probe.md``), ``responder`` (the far side's
logic), ``analysis`` (statistics and verdict) are pure; ``net`` is the asyncio shell.
"""
