"""How the runs of a sweep execute: one run, whose failure becomes a row rather than an
exception, and the backends that run many (serial, a local process pool, Ray)."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from recperf.cluster.api import RunSpec, run_summary, simulate
from recperf.cluster.metrics import job_columns
from recperf.core.errors import ConfigError
from recperf.core.pools import off_main_thread, start_pool_helpers

RUN_KEYS = ("trace", "cluster", "scheduler", "congestion", "seed")
MAX_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class SweepRun:
    """One point of a sweep: its keys and the RunSpec that simulates it."""

    trace: str
    """The trace entry as given (``NAME`` or ``NAME@CLUSTER``)."""
    cluster: str
    """The name of the cluster it runs on."""
    scheduler: str
    congestion: float
    seed: int
    spec: RunSpec

    def keys(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RUN_KEYS}


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one run sends back: its row, and its per-job columns when they were asked for."""

    row: dict[str, Any]
    jobs: dict[str, Any] | None = None


def run_one(run: SweepRun, keep_jobs: bool = False) -> RunOutcome:
    """Simulate one run; any exception becomes a failed row instead of propagating."""
    t0 = time.perf_counter()
    try:
        res = simulate(run.spec)
        summary = run_summary(run.spec, res)
        jobs = job_columns(res) if keep_jobs else None
    except Exception as exc:
        return failed_outcome(run, exc, time.perf_counter() - t0)
    row = {**run.keys(), "status": "ok", "error": "", "wall_s": time.perf_counter() - t0}
    row.update((k, _cell(v)) for k, v in summary.items() if k not in row)
    if jobs is not None:
        n = len(res.jobs)
        tags = {k: [v] * n if isinstance(v, str) else np.full(n, v) for k, v in run.keys().items()}
        jobs = {**tags, **jobs}
    return RunOutcome(row, jobs)


def _cell(value: Any) -> Any:
    """A summary value as a runs.parquet cell: a mapping (``dropped_invalid_by_reason``) as its
    JSON text, since as a Parquet struct its fields would change from run to run."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value


def failed_outcome(run: SweepRun, exc: BaseException, wall_s: float = math.nan) -> RunOutcome:
    return RunOutcome(
        {**run.keys(), "status": "failed", "error": error_text(exc), "wall_s": wall_s}
    )


def error_text(exc: BaseException) -> str:
    """``ExcType: message`` on one line (a Ray task error is reported as its cause)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


OnDone = Callable[[int, RunOutcome], None]


def _run_serial(runs: Sequence[SweepRun], keep_jobs: bool, on_done: OnDone) -> None:
    for i, run in enumerate(runs):
        on_done(i, run_one(run, keep_jobs))


Task = Callable[[SweepRun, bool], RunOutcome]


def _run_local(
    runs: Sequence[SweepRun], keep_jobs: bool, workers: int, on_done: OnDone, task: Task = run_one
) -> None:
    """Run on a process pool. A worker that dies (segfault, OOM kill) breaks the whole pool and
    fails every unfinished run with it: those are retried on a fresh pool, and when a pool makes
    no progress, one at a time, so that only the run that kills its worker is reported failed."""
    todo, width = list(range(len(runs))), workers
    while todo:
        broken = _pool_pass(runs, todo, keep_jobs, width, on_done, task)
        if broken and width == 1:  # one worker runs tasks in order: the first broken one crashed
            i, exc = broken[0]
            on_done(i, failed_outcome(runs[i], exc))
            broken = broken[1:]
        stalled = len(broken) == len(todo)
        todo, width = [i for i, _ in broken], 1 if stalled else workers


def _pool_pass(
    runs: Sequence[SweepRun],
    todo: Sequence[int],
    keep_jobs: bool,
    workers: int,
    on_done: OnDone,
    task: Task,
) -> list[tuple[int, BaseException]]:
    """One pool over ``todo``; returns the runs lost to a broken pool, in submission order."""
    # fork is unsafe in a process with threads (rich, pyarrow); forkserver/spawn start clean.
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    start_pool_helpers(method)  # a closed terminal's SIGHUP must not kill them under the pool
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=mp.get_context(method), initializer=_worker_init
    )
    broken: list[tuple[int, BaseException]] = []
    stopping = threading.Event()

    def drive() -> None:  # off the main thread, where an interrupt cannot leave a lock held
        futures: dict[Future[RunOutcome], int] = {}
        for i in todo:
            if stopping.is_set():
                return
            futures[pool.submit(task, runs[i], keep_jobs)] = i
        for fut in as_completed(futures):
            if stopping.is_set():
                return
            i = futures[fut]
            try:
                outcome = fut.result()
            except BrokenProcessPool as exc:
                broken.append((i, exc))
                continue
            except Exception as exc:  # e.g. a result that cannot be pickled back
                outcome = failed_outcome(runs[i], exc)
            on_done(i, outcome)

    def stop() -> None:  # interrupted (SIGINT, SIGTERM): stop the runs, do not wait for them
        stopping.set()
        _terminate_workers(pool)

    try:
        off_main_thread(drive, stop)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(broken, key=lambda b: b[0])  # todo is ascending: submission order


def _worker_init() -> None:
    """A pool worker ignores Ctrl-C and a hang-up (the terminal sends them to the whole process
    group): the parent owns shutdown, and a worker's KeyboardInterrupt traceback is noise."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's workers, wait for them (killing any that linger), then close this
    process's copy of the result pipe's writing end. A worker killed while it sent a result
    leaves half a message in the pipe, and the pool's manager thread, reading it, would wait
    for the rest for ever (this process holds a writer too, so no EOF comes): with every writer
    closed the read ends in EOFError, and the manager marks the pool broken and exits."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for proc in processes:
        with contextlib.suppress(OSError, ValueError):
            proc.terminate()
    for proc in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            proc.join(TERMINATE_WAIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(TERMINATE_WAIT_S)
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None and not any(p.is_alive() for p in processes):
        with contextlib.suppress(OSError):
            writer.close()


TERMINATE_WAIT_S = 5.0
"""How long a terminated worker may take to exit before it is killed."""


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError(
            "--backend ray needs Ray, which is not installed: pip install 'recperf[ray]'"
        ) from None


def _init_ray(ray: Any, workers: int, address: str | None) -> None:
    """Connect to the Ray cluster at ``address``, or start one here; no cluster at that address
    (or Ray failing to start) is one ConfigError, before any run."""
    try:
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError, grpc errors ...
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        where = f"the Ray cluster at --address {address}" if address else "a local Ray"
        raise ConfigError(
            f"--backend ray: cannot start or reach {where}: {type(exc).__name__}: {first}"
        ) from None


def _run_ray(
    runs: Sequence[SweepRun],
    keep_jobs: bool,
    workers: int,
    address: str | None,
    on_done: OnDone,
    task: Task = run_one,
    on_start: Callable[[], None] | None = None,
) -> None:
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        _init_ray(ray, workers, address)
    if on_start is not None:  # connected: the runs begin
        on_start()
    pending: dict[Any, int] = {}
    try:
        remote = ray.remote(num_cpus=1)(task)
        pending = {remote.remote(run, keep_jobs): i for i, run in enumerate(runs)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # RayTaskError, WorkerCrashedError, ...
                    outcome = failed_outcome(runs[i], exc)
                on_done(i, outcome)
    finally:
        for ref in pending:  # interrupted: do not leave tasks running on a shared cluster
            ray.cancel(ref)
        if started:
            ray.shutdown()
