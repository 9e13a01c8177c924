"""Collectives in the WAN lab: wangate allreduce against Gloo and the naive all-to-all."""
