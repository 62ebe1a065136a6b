"""Ingestion tuners, one per module; importing this package registers them all."""

from recperf.ingest.tuners import autotune, intune, oracle, plumber, static

__all__ = ["autotune", "intune", "oracle", "plumber", "static"]
