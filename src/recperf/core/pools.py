"""Process pools that survive nothing but their parent's own decision: multiprocessing's helper
processes started so that a closed terminal's hang-up does not kill them under a running pool."""

from __future__ import annotations

import signal
from multiprocessing import forkserver, resource_tracker


def start_pool_helpers(method: str) -> None:
    """Start multiprocessing's resource tracker (and, for ``method`` forkserver, its fork
    server) with SIGHUP blocked. They ignore Ctrl-C and SIGTERM themselves, but not a hang-up,
    which a closed terminal sends the whole process group: a killed tracker is relaunched and
    prints a traceback for every semaphore it no longer knows. A blocked signal stays blocked
    across fork and exec, so they never see it, nor do the workers the fork server forks; the
    parent, unblocked again at once, gets its SIGHUP and shuts the pool down itself."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
        if method == "forkserver":
            forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
