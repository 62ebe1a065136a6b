"""The simulator's documented bounds on input values, in one place (traces, sweeps; seeds
follow ``core.config.check_seed``)."""

from __future__ import annotations

YEAR_S = 365.25 * 86_400.0
MAX_TRACE_S = 10 * YEAR_S
"""Largest arrival time or duration a trace (or a synthetic config) may give: 10 years."""
MAX_COUNT = 1e12
"""Largest count a trace may give (iterations, steps, GPUs)."""
MAX_SWEEP_RUNS = 10_000
"""A sweep larger than this is refused unless ``--max-runs`` raises the limit."""
