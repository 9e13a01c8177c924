"""The bench's own tests: its runner, its suites, its bounds (``tests/`` tests the gateway
and imports nothing of ``bench``)."""
