"""Delivery to the site's trainers: what arrived, until a trainer's ``recv`` takes it.

``trainers.TrainerDelivery`` is the layer's face: the peer drivers hand it what arrives
(it is their ``DeliverySink``), the service asks it for what a ``recv`` wants. Below it:
``inbox`` (waiting recvs, per-source budgets, over the pure ``mailbox``), ``streams``
(large messages taken while they arrive), ``segments`` (the shared memory their bodies
are assembled in), ``delivered`` (the record of one arrived message).
"""
