"""The shared options hold what they are given to account: a ``--config`` TOML value must have
its field's type (a string is not a number there), and two command-line values for one key that
disagree (``--set`` twice, a shortcut flag and ``--set``, an alias and ``--set``) are one line
naming both, before any work."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.core.config import Options, from_mapping
from recperf.core.errors import ConfigError

runner = CliRunner()


@dataclass(kw_only=True, slots=True, frozen=True)
class Mlp:
    """A Config with a list field."""

    bottom_mlp: tuple[int, ...] = (64,)
    """Layer widths."""


SYNTH = ("cluster", "simulate", "--trace", "synthetic", "--scheduler", "fifo")


def one_line_error(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('[synthetic]\njobs = "100"\n', "[synthetic] jobs: expected an integer, got the string"),
        ("[synthetic]\njobs = true\n", "[synthetic] jobs: expected an integer, got True"),
        ("[synthetic]\njobs = 1.5\n", "[synthetic] jobs: expected an integer, got 1.5"),
        ('[synthetic]\nload = "0.5"\n', "[synthetic] load: expected a number, got the string"),
        ('[engine]\nrecord_segments = "true"\n',
         "[engine] record_segments: expected true or false, got the string 'true'"),
        ("[engine]\nrecord_segments = 1\n",
         "[engine] record_segments: expected true or false, got 1"),
    ],
)  # fmt: skip
def test_a_toml_value_of_the_wrong_type_names_file_table_key_and_type(
    tmp_path: Path, table: str, needle: str
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(table)
    err = one_line_error(*SYNTH, "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert f"{cfg}: {needle}" in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_flag_overrides_a_wrong_toml_value_and_the_same_value_from_text_is_read(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('[synthetic]\njobs = "100"\nload = 0.5\n')
    out = tmp_path / "o"
    res = runner.invoke(app, [*SYNTH, "--config", str(cfg), "--jobs", "6", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["jobs_total"] == 6


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ('"64,64"', "expected a list, got the string '64,64'"),
        ('[64, "64"]', "expected an integer, got the string '64'"),
        ("[64, true]", "expected an integer, got True"),
    ],
)
def test_typed_lists_are_held_to_their_item_type(value: str, needle: str) -> None:
    opts = Options()
    opts.set_typed("bottom_mlp", tomllib.loads(f"v = {value}")["v"], "f.toml: [dlrm] bottom_mlp")
    with pytest.raises(ConfigError, match=r"^f\.toml: \[dlrm\] bottom_mlp: ") as info:
        from_mapping(Mlp, opts, "dlrm")
    assert needle in str(info.value)
    assert from_mapping(Mlp, {"bottom_mlp": "64,64"}).bottom_mlp == (64, 64)  # CLI text


def test_a_value_set_again_is_no_longer_held_to_the_file() -> None:
    opts = Options()
    opts.set_typed("bottom_mlp", "64,64", "f.toml: [dlrm] bottom_mlp")
    opts["bottom_mlp"] = "32,32"  # what --set does over the file
    assert from_mapping(Mlp, opts, "dlrm").bottom_mlp == (32, 32)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "synthetic.jobs=5", "--set", "synthetic.jobs=6"],
         "--set synthetic.jobs=5 and --set synthetic.jobs=6 give synthetic.jobs different values"),
        (["--set", "synthetic.jobs=5", "--jobs", "6"],
         "--set synthetic.jobs=5 and --jobs 6 give synthetic.jobs different values"),
        (["--set", "engine.round_s=30", "--round-s", "60"],
         "--set engine.round_s=30 and --round-s 60.0 give engine.round_s different values"),
        (["--opt", "backfill=true", "--set", "fifo.backfill=false"],
         "--set fifo.backfill=false and --opt fifo.backfill=true give fifo.backfill different"),
    ],
)  # fmt: skip
def test_two_command_line_values_for_one_key_are_refused_naming_both(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    err = one_line_error(*SYNTH, *args, "--out", str(tmp_path / "o"))
    assert needle in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_the_same_value_twice_is_fine(tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = ["--set", "synthetic.jobs=5", "--set", "synthetic.jobs=5", "--jobs", "5",
            "--set", "synthetic.load=0.50", "--load", "0.5", "--out", str(out)]  # fmt: skip
    res = runner.invoke(app, [*SYNTH, *args])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["jobs_total"] == 5


def test_timers_flag_and_set_disagree(tmp_path: Path) -> None:
    args = ("cluster", "simulate", "--trace", "tiresias-60", "--scheduler", "netsens")
    err = one_line_error(*args, "--timers", "auto", "--set", "netsens.timers=9,3",
                         "--out", str(tmp_path / "o"))  # fmt: skip
    assert "--set netsens.timers=9,3 and --timers auto give netsens.timers different" in err


def test_profile_option_alias_and_set_disagree(tmp_path: Path) -> None:
    err = one_line_error("stalls", "profile", "--workload", "mlp", "--option", "hidden=8,8",
                         "--set", "mlp.hidden=16,16", "--out", str(tmp_path / "o"))  # fmt: skip
    assert "--set mlp.hidden=16,16 and --option mlp.hidden=8,8 give mlp.hidden different" in err
