"""``off_main_thread``: an interrupt of the main thread at any moment leaves no lock of the
futures it waits on held, so the threads that complete them never block (the sweep's pool
hung in ``shutdown`` when a SIGTERM landed inside ``as_completed`` on the main thread)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future, as_completed

import pytest

from recperf.core.pools import off_main_thread


@pytest.fixture
def alarm() -> Iterator[None]:
    old = signal.getsignal(signal.SIGALRM)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _interrupt_once(*_: object) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    raise KeyboardInterrupt


def _held(futures: list[Future[int]]) -> int:
    """How many of the futures' locks another thread cannot take."""
    count = [0]

    def probe() -> None:
        for fut in futures:
            if fut._condition.acquire(timeout=0):
                fut._condition.release()
            else:
                count[0] += 1

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return count[0]


@pytest.mark.parametrize("delay_ms", range(1, 13))
def test_an_interrupt_while_waiting_on_futures_leaves_no_lock_held(
    alarm: None, delay_ms: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the alarm stands in for the CLI's interrupts, deferred as they are while the helper starts
    monkeypatch.setattr("recperf.core.pools.INTERRUPTS", (signal.SIGALRM,))
    futures: list[Future[int]] = [Future() for _ in range(20_000)]
    stopped = []

    def stop() -> None:  # as the sweep terminates its workers: the futures end
        stopped.append(True)
        for fut in futures:
            if not fut.done():
                fut.set_exception(RuntimeError("stopped"))

    ran = []

    def work() -> int:
        ran.append(True)
        return sum(1 for _ in as_completed(futures))

    signal.signal(signal.SIGALRM, _interrupt_once)
    signal.setitimer(signal.ITIMER_REAL, delay_ms / 1000)
    with pytest.raises(KeyboardInterrupt):
        off_main_thread(work, stop)
    # an interrupt before the work began leaves nothing running to stop;
    # once it began, it is stopped, waited for, and what it started meanwhile stopped
    assert (stopped == [True, True]) if ran else (stopped in ([], [True], [True, True])), (
        ran,
        stopped,
    )
    assert _held(futures) == 0
    assert "recperf-pool-driver" not in [t.name for t in threading.enumerate()]


def test_the_result_or_the_error_of_the_work_reaches_the_main_thread() -> None:
    assert off_main_thread(lambda: threading.current_thread().name, stop=lambda: None) == (
        "recperf-pool-driver"
    )

    def fail() -> None:
        raise ValueError("bad run")

    with pytest.raises(ValueError, match="bad run"):
        off_main_thread(fail, stop=lambda: None)


def test_a_signal_while_the_helper_starts_is_handled_once_it_has(alarm: None) -> None:
    """Deferred, not lost: the helper starts, is stopped and waited for, then the interrupt."""
    events: list[str] = []
    release = threading.Event()

    def work() -> None:
        events.append("work")
        release.wait(5)

    def stop() -> None:
        events.append("stop")
        release.set()

    signal.signal(signal.SIGALRM, _interrupt_once)
    with pytest.raises(KeyboardInterrupt), pytest.MonkeyPatch.context() as mp:
        real_start = threading.Thread.start

        def slow_start(self: threading.Thread) -> None:
            signal.raise_signal(signal.SIGALRM)  # arrives while the helper starts
            real_start(self)

        mp.setattr(threading.Thread, "start", slow_start)
        mp.setattr("recperf.core.pools.INTERRUPTS", (signal.SIGALRM,))
        off_main_thread(work, stop)
    assert sorted(events) == ["stop", "stop", "work"]
