"""Network-sensitive scheduling: delay scheduling for consolidation, sensitivity-scaled timers
that tune themselves, and preemption that gives consolidated GPUs to the jobs that need them.

* **Sensitivity.** Each job's slowdown at rack level and across racks comes from the trace's
  measurement where it has one (Philly: spread vs consolidated throughput per job type) and
  from the communication model at the run's congestion otherwise (``recperf.cluster.sensitivity``).
* **Priority.** Arrival order (``order = "fifo"``, the default; a job that cannot be placed
  lets later ones start) or Tiresias' 2D-LAS queues (``order = "las"``), which also preempt
  lower queues. No job duration is assumed known either way.
* **Delay scheduling.** A waiting job may use only its tightest level (one machine if it fits
  one). After waiting ``rack timer x s`` it may take a rack-level placement, after ``network
  timer x s`` a cross-rack one, where ``s = min(1, loss / sensitivity_ref)`` and ``loss`` is the
  slowdown minus one at that level: an insensitive job spreads at once, a sensitive one waits.
  A job whose demand cannot fit a machine (a rack) starts at rack (cluster) level directly.
* **Timers.** Fixed (``timers = "RACK_S,NET_S"``) or ``auto``: per GPU-demand class (1, 2,
  3-4, 5-8, ... GPUs), the mean plus two standard deviations (``auto_stat``) of the last
  ``auto_window`` locality waits that ended in a machine-level placement (rack timer) or a
  rack-level one (network timer), bounded by ``auto_max_s``. A locality wait runs from the
  first decision at which the job could have started spread on free GPUs but was held back,
  to its start; jobs placed at once are not waits. A class with fewer than
  ``auto_min_samples`` waits uses all classes' waits, and before that ``auto_initial_s``.
* **Network-sensitive preemption.** GPUs are leases of ``lease_s``; at a preemption round:
  - *reclaim*: a job held back for locality for ``reclaim_after_s`` takes a machine (rack)
    from expired-lease jobs that would lose at most half as much as it does if spread, when
    the free GPUs can take those jobs at once;
  - *migrate*: a running job whose lease expired, placed wider than its tightest level and
    losing at least ``migrate_min_loss`` of its time to the network (at its current,
    shared-uplink rate), takes a machine (rack) back from such less sensitive jobs.
  The moved jobs checkpoint; when the GPUs are free (``checkpoint_s`` later) the sensitive
  job starts consolidated first, then the displaced ones, at any level. A move happens only
  if its expected saving exceeds its cost: the held job's GPUs x loss x time held so far, or
  the spread job's run so far (the LAS predictor of what remains) x GPUs x share of time lost,
  against ``migrate_cost_s`` (checkpoint + restore) per moved GPU plus each displaced job's
  own loss from running spread for as long again as it has run.

**No starvation.** (1) Locality waits are bounded: after its network timer (at most
``auto_max_s``, or the fixed value) a job takes any free GPUs. (2) A displaced job restarts
next, ahead of every other waiting job, at any level, on GPUs that were free when it was
displaced; a job can be displaced at most once per lease. (3) With ``order = "las"``, a
waiting job is promoted to the top queue after waiting ``promote_factor`` times its run so far
(at least ``lease_s``), as in Tiresias. (4) Every run lasts at least a lease before it can be
preempted, so a job progresses between preemptions.

Modules: ``config`` (the options), ``timers`` (the learned timers), ``policy`` (the scheduler,
registered as ``netsens``), ``preemption`` (the planner of moves).
"""

from recperf.cluster.schedulers.netsens.config import NetSensConfig, parse_timers
from recperf.cluster.schedulers.netsens.policy import NetSens
from recperf.cluster.schedulers.netsens.preemption import PreemptionPlanner
from recperf.cluster.schedulers.netsens.timers import TimerTuner, demand_class

__all__ = [
    "NetSens",
    "NetSensConfig",
    "PreemptionPlanner",
    "TimerTuner",
    "demand_class",
    "parse_timers",
]
