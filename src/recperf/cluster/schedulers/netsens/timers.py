"""netsens' learned delay timers (``timers = "auto"``): per GPU-demand class and level, a statistic
of the recent locality waits that ended in a placement at that level: machine-level waits set the
rack timer, rack-level ones the next timer out, and so on up the switch tree."""

from __future__ import annotations

from collections import deque

import numpy as np

from recperf.cluster.schedulers.netsens.config import NetSensConfig
from recperf.cluster.topology import Level

_MACHINE = int(Level.MACHINE)


def demand_class(gpus: int) -> int:
    """GPU-demand class: 0 for 1 GPU, then one class per power of two (2, 3-4, 5-8, ...)."""
    return max(int(gpus) - 1, 0).bit_length()


class TimerTuner:
    """Learns delay timers per GPU-demand class from recent locality waits."""

    def __init__(self, cfg: NetSensConfig, steps: int = 2) -> None:
        self.cfg = cfg
        self.steps = steps
        """Timers per class: one per level a job may be relaxed to (top - 1)."""
        self._waits: dict[tuple[int, int], deque[float]] = {}
        self._cache: dict[int, tuple[float, ...]] = {}
        self.version = 0
        """Bumped by every recorded wait (timers may have changed)."""

    def record(self, cls: int, level: int, wait_s: float) -> None:
        """A job of class ``cls`` started at ``level`` after a locality wait of ``wait_s``.

        Only jobs that were held back count: one placed at once says nothing about how long
        locality takes to come once a job has to wait for it."""
        if not _MACHINE <= level < _MACHINE + self.steps or wait_s <= 0:
            return
        key = (cls, level)
        if key not in self._waits:
            self._waits[key] = deque(maxlen=self.cfg.auto_window)
        self._waits[key].append(wait_s)
        self.version += 1
        self._cache.clear()  # classes without enough waits of their own use the pooled ones

    def _stat(self, cls: int, level: int, initial: float) -> float:
        """The ``auto_stat`` of the class's recent waits; of all classes' while the class has
        too few; ``initial`` while all classes together have too few."""
        waits = self._waits.get((cls, level))
        if waits is None or len(waits) < self.cfg.auto_min_samples:
            pooled = [w for (_, lv), ws in self._waits.items() if lv == level for w in ws]
            if len(pooled) < self.cfg.auto_min_samples:
                return initial
            arr = np.asarray(pooled, dtype=np.float64)
        else:
            arr = np.fromiter(waits, dtype=np.float64)
        if self.cfg.auto_stat == "max":
            stat = float(arr.max())
        elif self.cfg.auto_stat == "p90":
            stat = float(np.percentile(arr, 90))
        else:
            stat = float(arr.mean() + 2.0 * arr.std())
        return min(stat, self.cfg.auto_max_s)

    def timers(self, cls: int) -> tuple[float, ...]:
        """The class's timers, ToR first (the rack timer, then the network timer on racks x
        machines); each never shorter than the one before."""
        hit = self._cache.get(cls)
        if hit is None:
            r0, n0 = self.cfg.auto_initial_s
            out = [self._stat(cls, _MACHINE, r0)]
            for k in range(1, self.steps):
                out.append(max(self._stat(cls, _MACHINE + k, n0), out[-1]))
            hit = tuple(out)
            self._cache[cls] = hit
        return hit

    def snapshot(self) -> dict[int, tuple[float, ...]]:
        """Current timers of every class seen so far."""
        return {c: self.timers(c) for c in sorted({c for c, _ in self._waits})}
