"""The local API: trainers talk to their site's gateway over a Unix socket.

``protocol`` (frames, pure), ``framing`` (reading frames from sockets), ``mailbox``
(matching deliveries to receives, pure), ``inbox`` (its asyncio shell), ``access``
(who may connect: peer credentials against the allow lists), and ``server`` (the
socket server).
"""
