"""from_mapping: strict keys, CLI-string coercion, tuples and Literals; check_range messages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from recperf.core.config import (
    check_range,
    from_mapping,
    load_toml,
    parse_floats,
    parse_ints,
    parse_names,
    parse_seeds,
    parse_sets,
)
from recperf.core.errors import ConfigError


@dataclass(kw_only=True, frozen=True, slots=True)
class Sample:
    """Every field kind from_mapping converts."""

    count: int = 1
    rate: float = 0.5
    label: str = "x"
    enabled: bool = False
    sizes: tuple[int, ...] = (1,)
    names: tuple[str, ...] = ()
    mode: Literal["exp", "lognormal"] = "exp"
    limit: float | None = None


def test_unknown_key_names_it_and_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(Sample, {"count": 2, "colour": "red"}, source="cfg.toml")
    assert str(err.value) == (
        "cfg.toml: unknown key 'colour'; allowed: count, enabled, label, limit, mode, names, "
        "rate, sizes"
    )


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("count", "12", 12),
        ("count", 12, 12),
        ("rate", "2.5", 2.5),
        ("rate", "3", 3.0),
        ("rate", 3, 3.0),
        ("label", "hello", "hello"),
        ("enabled", "true", True),
        ("enabled", "Yes", True),
        ("enabled", "1", True),
        ("enabled", "false", False),
        ("enabled", "no", False),
        ("enabled", True, True),
        ("sizes", "1,2, 4", (1, 2, 4)),
        ("sizes", [8, 16], (8, 16)),
        ("sizes", "", ()),
        ("names", "a,b", ("a", "b")),
        ("mode", "lognormal", "lognormal"),
        ("limit", None, None),
        ("limit", "7.5", 7.5),
    ],
)
def test_values_are_coerced_from_cli_strings_and_toml(
    key: str, raw: object, expected: object
) -> None:
    built = from_mapping(Sample, {key: raw})
    value = getattr(built, key)
    assert value == expected
    assert type(value) is type(expected)


def test_float_is_exact_not_rounded() -> None:
    assert from_mapping(Sample, {"rate": "0.1"}).rate == 0.1


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [
        ("count", "1.5", "src: count: expected an integer, got '1.5'"),
        ("count", True, "src: count: expected an integer, got True"),
        ("count", 2.0, "src: count: expected an integer, got 2.0"),
        ("rate", "fast", "src: rate: expected a finite number, got 'fast'"),
        ("rate", False, "src: rate: expected a number, got False"),
        ("label", 3, "src: label: expected a string, got 3"),
        ("enabled", "maybe", "src: enabled: expected true or false, got 'maybe'"),
        ("sizes", "1,two", "src: sizes: expected an integer, got 'two'"),
        ("sizes", 4, "src: sizes: expected a list, got 4"),
        ("mode", "normal", "src: mode: 'normal' is not one of 'exp', 'lognormal'"),
        ("limit", "none", "src: limit: expected a finite number, got 'none'"),
    ],
)
def test_bad_values_are_one_line_errors(key: str, raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(Sample, {key: raw}, source="src")
    assert str(err.value) == message


def test_defaults_are_kept_for_missing_keys() -> None:
    assert from_mapping(Sample, {}) == Sample()


def test_not_a_dataclass_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        from_mapping(dict, {})


def test_post_init_validation_runs() -> None:
    from recperf.cluster.outcome import EngineConfig

    with pytest.raises(
        ConfigError, match=r"^config: restore_s = -1\.0 is outside the allowed range"
    ):
        from_mapping(EngineConfig, {"restore_s": "-1"})
    cfg = from_mapping(EngineConfig, {"restore_s": "5", "record_segments": "true", "round_s": 0})
    assert (cfg.restore_s, cfg.record_segments, cfg.round_s) == (5.0, True, 0.0)


def test_tuple_field_of_a_real_config_from_cli_string() -> None:
    from recperf.cluster.schedulers.tiresias import TiresiasConfig

    cfg = from_mapping(TiresiasConfig, {"thresholds_gpu_s": "100,2000"})
    assert cfg.thresholds_gpu_s == (100.0, 2000.0)


def test_literal_field_of_a_real_config() -> None:
    from recperf.cluster.traces.synthetic import SyntheticConfig

    assert (
        from_mapping(SyntheticConfig, {"duration_dist": "lognormal"}).duration_dist == "lognormal"
    )
    with pytest.raises(
        ConfigError, match=r"duration_dist: 'pareto' is not one of 'exp', 'lognormal'"
    ):
        from_mapping(SyntheticConfig, {"duration_dist": "pareto"})


def test_toml_round_trip(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('count = 3\nsizes = [2, 4]\nmode = "lognormal"\nenabled = true\n')
    built = from_mapping(Sample, load_toml(path), source=str(path))
    assert (built.count, built.sizes, built.mode, built.enabled) == (3, (2, 4), "lognormal", True)


def test_toml_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: no such file"):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("count = = 3\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        load_toml(bad)


def test_parse_sets_by_scope() -> None:
    scopes = ["engine", "netsens", "pkg.mod:Sched"]
    pairs = ["engine.round_s=3", " netsens.timers = 1,2 ", "pkg.mod:Sched.x=a=b"]
    assert parse_sets(pairs, scopes) == {
        "engine": {"round_s": "3"},
        "netsens": {"timers": "1,2"},
        "pkg.mod:Sched": {"x": "a=b"},
    }
    assert parse_sets(None, scopes) == {}


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("novalue", r"--set 'novalue': expected SCOPE.key=value; scopes here: engine, fifo"),
        ("round_s=3", r"expected SCOPE.key=value"),
        ("tiresias.min_run_s=3", r"unknown scope 'tiresias'; scopes here: engine, fifo"),
        ("engine.=3", r"unknown scope 'engine'"),
    ],
)
def test_parse_sets_errors_name_the_pair_and_the_scopes(pair: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sets([pair], ["engine", "fifo"])


@pytest.mark.parametrize(
    ("text", "seeds"), [("0-4", (0, 1, 2, 3, 4)), ("0,3,7", (0, 3, 7)), ("0-2,9", (0, 1, 2, 9))]
)
def test_parse_seeds(text: str, seeds: tuple[int, ...]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "0-", "1,,2"])
def test_parse_seeds_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--seeds"):
        parse_seeds(text)


def test_list_parsers() -> None:
    assert parse_floats("1,2,4", "--congestion") == (1.0, 2.0, 4.0)
    assert parse_ints("16,32", "--block-n") == (16, 32)
    assert parse_names(" fifo, sjf ,", "--schedulers") == ("fifo", "sjf")
    for bad in ("", "1,x", "nan", "1,inf"):
        with pytest.raises(ConfigError, match="--congestion: expected comma-separated numbers"):
            parse_floats(bad, "--congestion")
    with pytest.raises(ConfigError, match="--block-n: expected comma-separated integers"):
        parse_ints("1.5", "--block-n")
    with pytest.raises(ConfigError, match="--schedulers is empty"):
        parse_names(" , ", "--schedulers")


@dataclass(kw_only=True, slots=True, frozen=True)
class Needs:
    """A Config with a required field."""

    size: int
    """Required."""
    ratio: float = 0.5
    """Optional."""


def test_missing_required_key_names_it_and_the_allowed_keys() -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(Needs, {"ratio": 0.1}, "widget")
    assert str(err.value) == "widget: missing required key 'size'; allowed: ratio, size"
    assert from_mapping(Needs, {"size": "3"}, "widget") == Needs(size=3)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", float("nan"), float("inf")])
def test_non_finite_numbers_are_rejected(value: object) -> None:
    with pytest.raises(ConfigError, match="widget: ratio: expected a finite number"):
        from_mapping(Needs, {"size": 1, "ratio": value}, "widget")


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (
            ("load", 0.0, 0.0, 100.0),
            {"lo_open": True},
            "load = 0.0 is outside the allowed range (0, 100]",
        ),
        (("jobs", 0, 1, 10), {}, "jobs = 0 is outside the allowed range [1, 10]"),
        (("x", 11, 1, 10), {}, "x = 11 is outside the allowed range [1, 10]"),
        (
            ("gbps", -1.0, 0.0, None),
            {"lo_open": True},
            "gbps = -1.0 is outside the allowed range (0, inf]",
        ),
        (("t", 5.0, None, 2.5), {}, "t = 5.0 is outside the allowed range [-inf, 2.5]"),
    ],
)
def test_check_range_message(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_range(*args, **kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("value", "lo", "hi", "lo_open"),
    [(1, 1, 10, False), (10, 1, 10, False), (0.001, 0.0, None, True), (-5.0, None, 0.0, False)],
)
def test_check_range_accepts_bounds(
    value: float, lo: float | None, hi: float | None, lo_open: bool
) -> None:
    check_range("v", value, lo, hi, lo_open=lo_open)


def test_json_and_toml_files_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    from recperf.core.config import load_json_object, load_toml

    (tmp_path / "m.json").write_bytes(b'\xef\xbb\xbf{"alpha_s": 1e-4}')
    (tmp_path / "c.toml").write_bytes(b"\xef\xbb\xbf[engine]\ncongestion = 2.0\n")
    assert load_json_object(tmp_path / "m.json", "a model") == {"alpha_s": 1e-4}
    assert load_toml(tmp_path / "c.toml") == {"engine": {"congestion": 2.0}}
