"""The local API: trainers talk to their site's gateway over a Unix socket.

``protocol`` (frames, pure), ``framing`` (reading frames from sockets), ``mailbox``
(matching deliveries to receives, pure), ``inbox`` (its asyncio shell), ``access``
(who may connect: peer credentials against the allow lists), ``server`` (the socket
server) and ``selfsite`` (a gateway that serves its own site only).
"""
