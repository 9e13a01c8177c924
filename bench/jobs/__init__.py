"""Jobs sharing one gateway, in the WAN lab (python -m bench jobs)."""
