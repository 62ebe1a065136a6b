"""``auto``'s first-forward pick, confirmed on the module's next real batches.

The first forward times the kernels on its one batch, a few rounds each: after the first round
that batch's rows are warm in the caches, while in use every batch brings rows of its own from
memory, and the order can change. On ``paper`` fp32 with per-bag inputs, ``bag-list`` won that
timing by 4% and then ran 8% slower than ``bag-concat`` on rotating batches; on ``mlperf`` fp16,
uniform ids, 20% slower (issue 27). Where other kernels came within ``TRIAL_MARGIN`` of the first
winner on the drop-in's roads, the next forwards run them in turn on the batches the caller
sends, two forwards in a row each, the second timed whole, ``DropInConfig.confirm`` timed
forwards each (where the two fastest came within ``TRIAL_TIE``, those two as many again); the
kernel with the fastest median then runs from on, and the autotune cache holds it. A forward
timed right after another kernel's finds warm the rows that one read where both read the same
rows (on float32 rows the reference and ``bag-list`` read the tables in place; ``bag-concat``
reads a stacked copy): one forward each in turn, ``bag-list`` won on
``paper`` fp32 in the TBE layout by 6% (3.70 against 3.93 ms a forward) and then ran 7% slower
than ``bag-concat``; timed after a forward of its own, as it runs once chosen, it came out 3%
behind (3.47 against 3.37 ms). The trial costs no extra work: every forward pools its batch,
only with a kernel that may be slower. The kernels on trial keep their layouts until it ends
(``bag-concat``'s stacked copy of the rows, the reference's float32 copy): for a few forwards,
the memory the first forward's timing held."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from recperf.embed.autotune import record_winner
from recperf.embed.dropin_choice import Group, Road
from recperf.embed.dropin_config import DropInConfig
from recperf.embed.kernel_choice import KernelChoice
from recperf.embed.timing import synchronize

TRIAL_MARGIN = 1.0
"""How close (relative) to the first forward's winner a kernel must come on its road there to
be tried on the next batches: on ``paper`` fp32, uniform ids, in the TBE layout, ``bag-concat``
took 1.4-1.7x the first winner's (``bag-list``) time on that batch and then ran 5-7% faster than
it on rotating batches (issue 27). A kernel twice as slow costs ``2 x confirm`` forwards at most,
once."""
TRIAL_MAX = 4
"""The most kernels a trial runs (the first winner and the fastest others): on a CPU, float
rows, the reference, FBGEMM's TBE, ``bag-concat`` and ``bag-list``."""
TRIAL_TIE = 0.1
"""Where the two fastest medians lie within this (relative) of each other after ``confirm``
timed forwards each, those two run ``confirm`` more each, once, and the verdict is on all
their forwards: on ``mlperf`` bf16 in the TBE layout, on a machine a neighbour disturbed,
``bag-list`` led ``bag-concat`` by 2-3% over 3 forwards each in 5 builds of 6 and then ran
1.3x slower than it; undisturbed, ``bag-concat`` led by 12-25% (issue 27)."""
_clock = time.perf_counter
TRIAL_LOCK = threading.Lock()
"""Trial forwards run one at a time (each swaps its group's kernel), in any module: a lock held
by the module would not survive ``copy.deepcopy``."""


@dataclass(slots=True)
class Trial:
    """One group's kernels tried in turn on real forwards (``roads``: the first winner first),
    two forwards each turn, the second timed; then, where the two fastest came within
    ``TRIAL_TIE``, those two again."""

    group: int
    """The group's index in its module."""
    roads: tuple[Road, ...]
    rounds: int
    """Timed forwards per kernel (per stage)."""
    seconds: list[list[float]] = field(default_factory=list)
    """Per kernel, its timed forwards' seconds."""
    active: tuple[int, ...] = ()
    """The roads this stage runs in turn: every road, then the two fastest where they came
    close."""
    turn: int = 0
    """Forwards this stage ran so far."""
    done: bool = False

    @classmethod
    def of(cls, group: int, roads: Sequence[Road], rounds: int) -> Trial | None:
        """The trial of the roads within ``TRIAL_MARGIN`` of the fastest (at most
        ``TRIAL_MAX``), or None where there is nothing to try (one kernel, none timed, or
        ``rounds`` 0)."""
        top = [r for r in roads if r.ms <= roads[0].ms * (1 + TRIAL_MARGIN)][:TRIAL_MAX]
        if rounds < 1 or len(top) < 2:  # an untimed road (NaN) is never within the margin
            return None
        return cls(group, tuple(top), rounds, [[] for _ in top], tuple(range(len(top))))

    def time(self, group: Group, call: Callable[[], Any]) -> Any:
        """``call`` (one forward) with the kernel whose turn it is running in ``group``: its
        first forward of the turn untimed, its second timed whole (on a GPU, from a
        synchronised start to its outputs' end)."""
        k = self.active[self.turn // 2 % len(self.active)]
        road = self.roads[k]
        group.run(road.choice, road.kernel)
        if not self.turn % 2:
            out = call()
        else:
            device = group.tables.device
            synchronize(device)
            t0 = _clock()
            out = call()
            synchronize(device)
            self.seconds[k].append(_clock() - t0)
        self.turn += 1
        if self.turn >= 2 * self.rounds * len(self.active):
            self._stage_over()
        return out

    @property
    def calls(self) -> int:
        """Forwards run so far, timed or not (each timed one after an untimed one)."""
        return sum(map(len, self.seconds)) * 2 + self.turn % 2

    def _stage_over(self) -> None:
        """Done, or (once) a stage of the two fastest where they came within ``TRIAL_TIE``."""
        ranked = sorted(self.active, key=lambda k: statistics.median(self.seconds[k]))
        a, b = ranked[:2]
        first, second = (statistics.median(self.seconds[k]) for k in (a, b))
        if second <= first * (1 + TRIAL_TIE) and len(self.seconds[a]) <= self.rounds:
            self.active, self.turn = (a, b), 0
        else:
            self.done = True

    def status(self) -> str:
        """What is on trial and how far it got, for ``describe``."""
        names = ", ".join(self.roads[k].choice.kernel for k in self.active)
        total = 2 * self.rounds * len(self.active)
        return f"on trial with {names} over real forwards ({self.turn} of {total} run)"

    def finish(self, group: Group, config: DropInConfig) -> KernelChoice:
        """The kernel with the fastest median forward, run in ``group`` from now on and made
        the autotune cache's winner (where the first forward cached one); its note says what
        each kernel took."""
        medians = [statistics.median(s) * 1e3 for s in self.seconds]
        k = min(self.active, key=medians.__getitem__)  # the last stage's fastest
        ranked = sorted(zip(self.roads, medians, strict=True), key=lambda rm: rm[1])
        listing = ", ".join(f"{r.choice.kernel} {ms:.3f} ms" for r, ms in ranked)
        first = self.roads[0].choice
        again = ""
        if len(self.seconds[k]) > self.rounds:  # a second stage ran: the last stage's two
            pair = " and ".join(self.roads[j].choice.kernel for j in self.active)
            again = f", {pair} {2 * self.rounds}: they came within {TRIAL_TIE:.0%}"
        note = (
            f"confirmed on the {self.calls} forwards after the first ({self.rounds} timed each"
            f"{again}, each after one of its own; medians): {listing}; on the first forward's "
            f"batch {first.kernel} won: {first.note}"
        )
        road = self.roads[k]
        choice = replace(road.choice, note=note)
        group.run(choice, road.kernel)
        if config.cache is not None and choice.cache_key:
            record_winner(
                config.cache, choice.cache_key, choice.kernel, medians[k], note, choice.params
            )
        return choice
