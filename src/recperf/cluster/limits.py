"""The simulator's documented bounds on input values, in one place (traces, seeds, sweeps)."""

from __future__ import annotations

from recperf.core.errors import ConfigError

YEAR_S = 365.25 * 86_400.0
MAX_TRACE_S = 10 * YEAR_S
"""Largest arrival time or duration a trace (or a synthetic config) may give: 10 years."""
MAX_COUNT = 1e12
"""Largest count a trace may give (iterations, steps, GPUs)."""
MAX_SEED = 2**63 - 1
"""Seeds are whole numbers from 0 to 2**63 - 1."""
MAX_SWEEP_RUNS = 10_000
"""A sweep larger than this is refused unless ``--max-runs`` raises the limit."""


def check_seed(seed: int, name: str = "seed") -> None:
    """A seed must be a whole number in [0, 2**63 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{name} = {seed!r}: seeds must be whole numbers from 0 to 2**63-1")
