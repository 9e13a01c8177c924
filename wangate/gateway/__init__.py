"""The gateway's service to its trainers and the backends below it.

``service.Service`` is written once over ``backend.Backend``; ``drivers.DriverBackend``
drives every peer in this process (its ``endpoint.Endpoint`` listens, dials,
authenticates and attaches links), ``wangate.workers.coordinator.Coordinator`` hands
stripes to worker processes; ``outcomes.OutcomeBook`` keeps what became of what was
sent. ``wangate.daemon.Gateway`` composes them. ARCHITECTURE.md has the whole map.
"""
