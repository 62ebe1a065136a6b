"""One road from a Config to a plug-in to the command line: a throw-away scheduler, tuner, kernel
and workload, each with a Config field recperf has never seen, are registered here (or named as
``module:attr``) and that field is set from ``--set``, from a ``--config`` TOML file and in a
sweep with no other edit; a missing or unknown key is one line naming it and the allowed keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.base import SCHEDULERS
from recperf.cluster.schedulers.fifo import Fifo, FifoConfig
from recperf.core.config import check_range
from recperf.ingest.base import Target
from recperf.ingest.tuners.base import TUNERS, TuneResult
from recperf.ingest.tuners.static import Static, StaticConfig
from recperf.stalls.run.workloads import MlpWorkload

runner = CliRunner()
SEEN: list[tuple[str, int]] = []
"""(kind, marker) for every throw-away plug-in built in this process."""


@dataclass(kw_only=True, slots=True, frozen=True)
class MarkedFifoConfig:
    """FIFO with a marker that must be given."""

    marker: int
    """Recorded when built; required (0..100)."""
    backfill: bool = False
    """As fifo's."""

    def __post_init__(self) -> None:
        check_range("marker", self.marker, 0, 100)


class MarkedFifo(Fifo):
    """fifo that records its marker."""

    name: ClassVar[str] = "marked-fifo"
    Config = MarkedFifoConfig  # type: ignore[assignment]

    def __init__(self, config: MarkedFifoConfig) -> None:
        super().__init__(FifoConfig(backfill=config.backfill))
        SEEN.append(("scheduler", config.marker))


@dataclass(kw_only=True, slots=True, frozen=True)
class MarkedStaticConfig:
    """static with a marker."""

    marker: int = 0
    """Recorded when the tuner runs."""
    window_s: float = 1.0
    """As static's."""


class MarkedStatic:
    """static that records its marker."""

    name: str = "marked-static"
    Config = MarkedStaticConfig

    def __init__(self, config: MarkedStaticConfig) -> None:
        self.config = config
        self.inner = Static(StaticConfig(window_s=config.window_s))

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        SEEN.append(("tuner", self.config.marker))
        return self.inner.tune(target, budget_s, seed)


@dataclass(kw_only=True, slots=True, frozen=True)
class ScaledConfig:
    """Options of the marked reference kernel."""

    marker: int = 1
    """Recorded when built."""


def marked_kernel() -> type:
    """The torch reference that records its marker; made on demand, because importing the
    kernels fixes Triton's interpreter mode (tests/embed/conftest.py sets it at collection)."""
    from recperf.embed.kernels.base import Tables
    from recperf.embed.kernels.reference import TorchReference

    class MarkedKernel(TorchReference):
        Config = ScaledConfig

        def __init__(self, tables: Tables, *, config: ScaledConfig) -> None:
            super().__init__(tables)
            self.name = "marked-kernel"
            SEEN.append(("kernel", config.marker))

    return MarkedKernel


@dataclass(kw_only=True, slots=True, frozen=True)
class SlimMlp(MlpWorkload):
    """An MLP with one hidden layer of ``width``: a Config field recperf has never seen, visible
    in the gradient bytes the profile reports. Named as ``test_plugins:SlimMlp``."""

    width: int = 8
    """The one hidden layer's width."""

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(self.features, self.width), nn.ReLU(), nn.Linear(self.width, self.classes)
        )


@pytest.fixture
def registered() -> Iterator[None]:
    from recperf.embed.kernels.base import KERNELS

    SEEN.clear()
    SCHEDULERS.register("marked-fifo")(MarkedFifo)
    TUNERS.register("marked-static")(MarkedStatic)
    KERNELS.register("marked-kernel")(marked_kernel())
    yield
    SCHEDULERS.unregister("marked-fifo")
    TUNERS.unregister("marked-static")
    KERNELS.unregister("marked-kernel")


def run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout + res.stderr


def test_scheduler_field_from_set_toml_and_sweep(registered: None, tmp_path: Path) -> None:
    base = ("cluster", "simulate", "--trace", "tiresias-60", "--scheduler", "marked-fifo")
    code, text = run(*base, "--set", "marked-fifo.marker=7", "--out", str(tmp_path / "a"))
    assert code == 0, text
    toml = tmp_path / "run.toml"
    toml.write_text("[marked-fifo]\nmarker = 8\n[engine]\nround_s = 0\n")
    code, text = run(*base, "--config", str(toml), "--out", str(tmp_path / "b"))
    assert code == 0, text
    code, text = run(
        "cluster", "sweep", "--traces", "tiresias-60", "--schedulers", "marked-fifo,fifo",
        "--seeds", "0-1", "--backend", "serial", "--set", "marked-fifo.marker=9",
        "--out", str(tmp_path / "c"),
    )  # fmt: skip
    assert code == 0, text
    # simulate builds once to validate and once to run; the sweep once per seed (+1 check)
    assert {m for kind, m in SEEN if kind == "scheduler"} == {7, 8, 9}
    assert [m for kind, m in SEEN].count(9) >= 2
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert a["scheduler"] == "marked-fifo" and a["jobs_finished"] == 60


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ((), "scheduler 'marked-fifo': missing required key 'marker'; allowed: backfill, marker"),
        (
            ("--set", "marked-fifo.marker=1", "--set", "marked-fifo.colour=red"),
            "scheduler 'marked-fifo': unknown key 'colour'; allowed: backfill, marker",
        ),
        (("--set", "marked-fifo.marker=x"), "marked-fifo': marker: expected an integer, got 'x'"),
        (("--set", "marked-fifo.marker=101"), "marker = 101 is outside the allowed range"),
        (("--set", "fifo.backfill=true"), "unknown scope 'fifo'; scopes here:"),
    ],
)
def test_bad_options_are_one_line(
    registered: None, tmp_path: Path, extra: tuple[str, ...], line: str
) -> None:
    code, text = run(
        "cluster", "simulate", "--trace", "tiresias-60", "--scheduler", "marked-fifo",
        *extra, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 2
    assert line in text and len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert not (tmp_path / "summary.json").exists()


def test_tuner_field_from_set_and_toml(registered: None, tmp_path: Path) -> None:
    base = ("ingest", "simulate", "--spec", "criteo-16", "--tuner", "marked-static")
    code, text = run(*base, "--budget-s", "5", "--set", "marked-static.marker=3", "--json")
    assert code == 0, text
    toml = tmp_path / "t.toml"
    toml.write_text("[marked-static]\nmarker = 4\nwindow_s = 2.0\n")
    code, text = run(*base, "--budget-s", "5", "--config", str(toml), "--out", str(tmp_path))
    assert code == 0, text
    assert [m for kind, m in SEEN if kind == "tuner"] == [3, 4]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tuner"] == "marked-static"
    code, text = run(*base, "--set", "marked-static.speed=1")
    assert code == 2 and "unknown key 'speed'; allowed: marker, window_s" in text


def test_kernel_field_from_set(registered: None, tmp_path: Path) -> None:
    code, text = run(
        "embed", "bench", "--config", "small", "--variants", "torch,marked-kernel",
        "--batch-size", "32", "--reps", "1", "--set", "marked-kernel.marker=5",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, text
    assert ("kernel", 5) in SEEN
    rows = json.loads((tmp_path / "bench.json").read_text())["variants"]
    assert [r["variant"] for r in rows] == ["torch", "marked-kernel"]
    toml = tmp_path / "k.toml"
    toml.write_text("[marked-kernel]\nmarker = 6\n")
    code, text = run(
        "embed", "bench", "--config", "small", "--variants", "marked-kernel", "--batch-size",
        "32", "--reps", "1", "--config-file", str(toml),
    )  # fmt: skip
    assert code == 0, text
    assert ("kernel", 6) in SEEN


def test_workload_field_from_set_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the ranks import test_plugins
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    base = ("stalls", "profile", "--workload", "test_plugins:SlimMlp", "--ranks", "1",
            "--iters", "2", "--warmup", "0", "--no-real-data", "--batch-size", "8")  # fmt: skip
    toml = tmp_path / "w.toml"
    toml.write_text('["test_plugins:SlimMlp"]\nfeatures = 16\n')
    code, text = run(
        *base, "--config", str(toml), "--set", "test_plugins:SlimMlp.width=4",
        "--out", str(tmp_path / "p"),
    )  # fmt: skip
    assert code == 0, text
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["workload_options"] == {"features": 16, "width": "4"}
    # float32 gradients of Linear(16, 4) and Linear(4, 10)
    assert summary["grad_bytes"] == 4 * (16 * 4 + 4 + 4 * 10 + 10)
    code, text = run(*base, "--set", "test_plugins:SlimMlp.depth=2", "--out", str(tmp_path / "q"))
    assert (
        code == 2 and "unknown key 'depth'; allowed: classes, features, hidden, name, width" in text
    )
