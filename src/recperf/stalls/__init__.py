"""Distributed-training stalls: so far the all-reduce communication model (``commmodel``)."""
