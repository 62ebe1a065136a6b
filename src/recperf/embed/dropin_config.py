"""How a drop-in ``EmbeddingBags`` picks and feeds its kernels (``DropInConfig``), and the
settings and tables it refuses before any work, each in one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.dropin_inputs import Source
from recperf.embed.kernel_choice import AUTO, AUTOTUNE_CACHE, hot_rows_from_trace, takes_hot_rows
from recperf.embed.traces import Trace

TRAIN_REFUSED = (
    "train(): EmbeddingBags is inference only (its outputs carry no gradient); "
    "call .eval(), or run it under torch.no_grad()"
)


@dataclass(kw_only=True, slots=True, frozen=True)
class DropInConfig:
    """How an ``EmbeddingBags`` picks and feeds its kernels."""

    kernel: str = "torch"
    """A registered kernel (``torch``, ``torch-hot``, ``triton`` ...), ``package.module:attr``,
    or ``auto``: the autotuner's cached winner for this device and these tables, else (with
    ``measure``) the fastest kernel timed on the first forward's input."""
    hot_fraction: float = 0.1
    """Share of each table's rows taken as hot from a ``sample`` trace, in (0, 1]."""
    count_hot_rows: bool = False
    """Let a kernel that remaps hot rows (``torch-hot``, ``hot-l2``, ``combined``), given
    neither ``hot_rows`` nor a ``sample``, count them itself in the inputs it is given
    (``torch-hot``: in its first batch, once). Off: such a kernel is refused."""
    measure: bool = True
    """For ``auto`` with no cached winner: time every kernel that reads the rows natively here
    (``kernel_choice.measured_choice``) on the first forward's input, cache the winner and run
    it from then on. Off: the reference runs, and ``describe()`` says why."""
    confirm: int = 5
    """For ``auto`` measuring on the first forward: where other kernels came within 2x that
    batch's winner's time, the next forwards run each of them (up to 4) in turn on the
    batches given, two forwards in a row each turn with the second timed, ``confirm`` timed
    forwards each (the two fastest, where within 10%, as many again), and the fastest median
    runs from then on (and is cached): one batch timed a few times, its rows warm, can rank
    kernels otherwise than batches in use do (``dropin_trial``). 0: the first forward's winner
    stays. Five: single forwards on a machine a neighbour disturbed spread by 15% or more, and
    the kernels on trial often lie 5-10% apart (issue 27)."""
    cache: Path | None = AUTOTUNE_CACHE
    """The autotune cache ``auto`` reads and ``tune`` and ``measure`` write (None: none)."""
    batch_size: int | None = None
    """For ``auto``: prefer winners tuned at the batch size nearest this (None: the fewest ms
    per id)."""
    trace: str | None = None
    """For ``auto``: only winners tuned on this trace (None: any)."""
    debug: bool = False
    """Also check every call's offsets and ids against the tables: a scan of every id and, on
    a GPU, a host sync. Off, a call checks what needs no look at the values (types, shapes,
    dtypes, devices, the count of inputs and bags); an id out of range then fails in the
    ``torch`` kernels (an IndexError) and is undefined in the Triton ones."""

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel:
            raise ConfigError(f"kernel: expected a kernel name or 'auto', got {self.kernel!r}")
        check_range("hot_fraction", self.hot_fraction, 0.0, 1.0, lo_open=True)
        if isinstance(self.confirm, bool) or not isinstance(self.confirm, int):
            raise ConfigError(f"confirm: expected a whole number of forwards, got {self.confirm!r}")
        check_range("confirm", self.confirm, 0, None)
        if self.batch_size is not None:
            check_range("batch_size", self.batch_size, 1, None)


NO_HOT = (
    "kernel {name!r} remaps hot rows: give hot_rows or a sample trace, or "
    "DropInConfig(count_hot_rows=True) to let it count them in the inputs it is given"
)


def check_kernel_inputs(
    config: DropInConfig,
    options: Mapping[str, Any] | None,
    hot_rows: Sequence[torch.Tensor] | None,
    sample: Trace | None,
) -> None:
    """The kernel settings that contradict each other, refused before any work."""
    if config.kernel == AUTO and options:
        raise ConfigError("options: 'auto' takes its options from the autotune cache")
    if hot_rows is not None and sample is not None:
        raise ConfigError("hot_rows, sample: give the hot rows or a trace to count, not both")
    if config.kernel == AUTO:
        return
    remaps = takes_hot_rows(config.kernel)
    if (hot_rows is not None or sample is not None) and not remaps:
        raise ConfigError(
            f"hot_rows: kernel {config.kernel!r} does not remap hot rows "
            "(torch-hot, hot-l2 and combined do)"
        )
    if remaps and hot_rows is None and sample is None and not config.count_hot_rows:
        raise ConfigError(NO_HOT.format(name=config.kernel))


def check_devices(source: Source) -> None:
    """All of the tables' rows, scales and biases on one device, or one error naming them."""
    where: dict[torch.device, str] = {}
    for t, spec in enumerate(source.tables):
        for x in (source.weights[t], source.scale_bias_of(t)):
            if isinstance(x, torch.Tensor):
                where.setdefault(x.device, spec.label)
    if len(where) > 1:
        found = ", ".join(f"{label} on {dev}" for dev, label in where.items())
        raise ConfigError(f"tables: all must be on one device, got {found}")


def hot_from_sample(
    sample: object, rows: Sequence[int], labels: Sequence[str], fraction: float
) -> tuple[torch.Tensor, ...]:
    """Per table its hot rows counted in ``sample`` (one id stream per table, each over its
    table's row count), or one error naming the stream that does not fit."""
    if not isinstance(sample, Trace):
        raise ConfigError(f"sample: expected a recperf Trace, got {type(sample).__name__}")
    if sample.tables != len(rows):
        raise ConfigError(
            f"sample: the trace has {sample.tables} id streams, the module {len(rows)} "
            "tables (one stream per table, in order)"
        )
    for t, (have, want) in enumerate(zip(sample.rows, rows, strict=True)):
        if have != want:
            raise ConfigError(
                f"sample: stream {t} is over {have:,} rows, {labels[t]} has {want:,} "
                "(a trace of other tables' ids names other rows)"
            )
    return hot_rows_from_trace(sample, rows, fraction)
