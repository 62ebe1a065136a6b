"""The network-sensitive scheduler's options: ``NetSensConfig`` (``--opt key=value``, TOML) and
the parsing of its ``timers`` text."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from recperf.core.config import check_range
from recperf.core.errors import ConfigError


def parse_timers(text: str) -> tuple[float, ...] | None:
    """``auto`` -> None; ``RACK_S,NET_S`` (or one value per switch level above a machine on a
    deeper tree, ToR first) -> the fixed timers in seconds, never decreasing outwards."""
    if text.strip().lower() == "auto":
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) < 2:
            raise ValueError
        timers = tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(
            f"timers = {text!r}: expected 'auto' or 'RACK_S,NET_S' (numbers of seconds, one per "
            "switch level above a machine)"
        ) from None
    ordered = all(a <= b for a, b in itertools.pairwise(timers))
    if not (timers[0] >= 0 and ordered and timers[-1] < float("inf")):
        raise ConfigError(
            f"timers = {text!r}: need 0 <= rack timer <= network timer (a cross-rack placement "
            f"waits at least as long as a rack-level one)"
        )
    return timers


def check_timers(timers: tuple[float, ...] | None, steps: int, levels: tuple[str, ...]) -> None:
    """Fixed timers must give one value per level a job may be relaxed to."""
    if timers is not None and len(timers) != steps:
        raise ConfigError(
            f"netsens.timers has {len(timers)} values; this cluster needs {steps}, one per "
            f"level a job may spread to ({', '.join(levels)})"
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class NetSensConfig:
    """Options of the network-sensitive scheduler (``--opt key=value``)."""

    timers: str = "auto"
    """'auto' (learned per GPU-demand class) or 'RACK_S,NET_S' fixed delay timers (on a deeper
    tree one value per switch level above a machine, e.g. 'TOR_S,POD_S,NET_S')."""
    sensitivity_ref: float = 0.05
    """Loss (slowdown - 1) at which a job waits its class's full timer; less waits less."""
    lease_s: float = 1_800.0
    """A started job keeps its GPUs at least this long."""
    order: Literal["fifo", "las"] = "fifo"
    """Priority among jobs: arrival order, or Tiresias' 2D-LAS queues (preempting by queue)."""
    thresholds_gpu_s: tuple[float, ...] = (3_600.0, 36_000.0)
    """order = "las": queue thresholds on attained GPU-seconds (as Tiresias)."""
    promote_factor: float = 4.0
    """order = "las": promote a waiting job to the top queue after waiting this many times its
    run so far (0: never)."""
    reclaim: bool = True
    """Let a job held back for locality take a machine (rack) from less sensitive jobs."""
    reclaim_after_s: float = 600.0
    """A held job reclaims only after being held back this long."""
    migrate: bool = True
    """Let spread, network-bound jobs take consolidated GPUs back from less sensitive jobs."""
    migrate_min_loss: float = 0.2
    """Least share of extra time lost to the network for a running job to be moved."""
    migrate_cost_s: float = 30.0
    """Seconds a move costs each moved job (checkpoint + restore) in the benefit test."""
    auto_initial_s: tuple[float, float] = (86_400.0, 86_400.0)
    """Auto: rack and network timers until ``auto_min_samples`` waits are seen (in all classes
    together; on a deeper tree the network value serves every level above the ToR). With no
    evidence yet a job waits long for locality, as under consolidation."""
    auto_stat: Literal["mean+2std", "p90", "max"] = "mean+2std"
    """Auto: the statistic of recent waits a timer is set to."""
    auto_window: int = 64
    """Auto: recent waits kept per class and level."""
    auto_min_samples: int = 5
    """Auto: waits a class needs before its own statistic is used (before: all classes')."""
    auto_max_s: float = 7 * 86_400.0
    """Auto: upper bound of a learned timer."""

    def __post_init__(self) -> None:
        parse_timers(self.timers)
        # Literal types are checked only when built from TOML or flags; a Config built in code
        # with another value would silently behave as the default.
        for name, allowed in (
            ("order", ("fifo", "las")),
            ("auto_stat", ("mean+2std", "p90", "max")),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} = {getattr(self, name)!r}: allowed: {', '.join(allowed)}"
                )
        t = self.thresholds_gpu_s
        if not t or t[0] <= 0 or any(b <= a for a, b in itertools.pairwise(t)):
            raise ConfigError(
                f"thresholds_gpu_s = {list(t)!r}: must be one or more positive, increasing values"
            )
        check_range("sensitivity_ref", self.sensitivity_ref, 1e-6, 1e6)
        check_range("lease_s", self.lease_s, 0.0, 1e7)
        check_range("promote_factor", self.promote_factor, 0.0, 1e6)
        check_range("reclaim_after_s", self.reclaim_after_s, 0.0, 1e9)
        check_range("migrate_min_loss", self.migrate_min_loss, 0.0, 1e6)
        check_range("migrate_cost_s", self.migrate_cost_s, 0.0, 1e7)
        check_range("auto_max_s", self.auto_max_s, 0.0, 1e7)
        check_range("auto_window", self.auto_window, 1, 1_000_000)
        check_range("auto_min_samples", self.auto_min_samples, 1, 1_000_000)
        a, b = self.auto_initial_s
        if not 0 <= a <= b:
            raise ConfigError(f"auto_initial_s = {[a, b]!r}: need 0 <= rack <= network")
