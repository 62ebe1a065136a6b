"""The installed peers as recperf kernels (``kernels/peers.py``) and the choice among every
kernel by measurement (``kernel_choice.measured_choice``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from recperf.core.errors import ConfigError
from recperf.embed.kernel_choice import measured_choice
from recperf.embed.kernels import KERNELS, Lookup, Tables, make_lookup
from recperf.embed.kernels.base import KernelTraits, kernels_for
from recperf.embed.kernels.reference import TorchReference

CPU_FLOAT = KernelTraits(formats=frozenset({"fp32"}), cpu=True)


class Slow(TorchReference):
    """The reference, pooled 20 times over: correct, and measurably the slowest."""

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        out = super().__call__(lookup)
        for _ in range(19):
            out = super().__call__(lookup)
        return out


class Wrong(TorchReference):
    """The reference plus one: fast, and wrong."""

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        return super().__call__(lookup) + 1.0


@pytest.fixture
def plugins() -> Iterator[None]:
    KERNELS.register("test-slow", traits=CPU_FLOAT)(Slow)
    KERNELS.register("test-wrong", traits=CPU_FLOAT)(Wrong)
    yield
    KERNELS.unregister("test-slow")
    KERNELS.unregister("test-wrong")


def _tables_and_lookups(seed: int = 0) -> tuple[Tables, list[Lookup]]:
    g = torch.Generator().manual_seed(seed)
    tables = Tables(weights=tuple(torch.randn(r, 8, generator=g) for r in (30, 5, 12)))
    lookups = [make_lookup(tables, batch_size=4, pooling_factor=3, seed=seed + i) for i in range(2)]
    return tables, lookups


def test_measured_choice_times_every_cpu_kernel_and_caches_the_winner(
    plugins: None, tmp_path: Path
) -> None:
    tables, lookups = _tables_and_lookups()
    cache = tmp_path / "tune.json"
    choice = measured_choice(tables, lookups, None, cache=cache, reps=3)
    assert choice.source == "measured"
    assert choice.kernel not in {"test-slow", "test-wrong", "torch-hot"}
    assert choice.kernel in kernels_for("fp32", "cpu")
    note = choice.note
    assert note.startswith(f"{choice.kernel} ") and "ms per batch" in note
    assert "test-wrong rejected (wrong result)" in note
    assert "torch-hot" not in note  # remaps ids: a candidate only with hot rows
    # every correct candidate is named with its time, the slow one after the winner
    assert "test-slow " in note and note.index("test-slow") > note.index(choice.kernel)
    again = measured_choice(tables, lookups, None, cache=cache, reps=3)
    assert (again.kernel, again.source) == (choice.kernel, "autotune cache")
    assert again.note.startswith(note)


def test_hot_row_kernels_are_candidates_only_with_hot_rows(tmp_path: Path) -> None:
    tables, lookups = _tables_and_lookups(1)
    hot = tuple(torch.arange(min(r, 3)) for r in tables.rows)
    choice = measured_choice(tables, lookups, hot, cache=None, reps=2)
    assert "torch-hot" in choice.note and choice.source == "measured"


def test_measured_choice_refuses_no_batches() -> None:
    tables, _ = _tables_and_lookups()
    with pytest.raises(ConfigError, match="lookups"):
        measured_choice(tables, [], None, cache=None)
