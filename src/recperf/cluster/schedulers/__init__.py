"""Scheduling policies, one per module; importing this package registers them all."""

from recperf.cluster.schedulers import consolidate, fifo, netsens, sjf, srtf, tiresias

__all__ = ["consolidate", "fifo", "netsens", "sjf", "srtf", "tiresias"]
