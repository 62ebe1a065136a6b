"""Registry: registration, duplicates, unknown names, ``module:attr`` entry points, building
through the entry's Config, tunable spaces and lazy loading of the built-ins' package."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from recperf.core.errors import ConfigError, RegistryError
from recperf.core.registry import Registry


class Widget:
    """A plug-in reachable as ``test_registry:Widget``."""

    def __init__(self, size: int = 1) -> None:
        self.size = size


@dataclass(kw_only=True, slots=True, frozen=True)
class GadgetConfig:
    """Options of a Gadget."""

    size: int = 1
    """How big."""
    mode: str = "a"
    """Which way."""

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"size = {self.size}: expected >= 1")


class Gadget:
    """A plug-in with a Config, built as ``Gadget(part, config=cfg)``."""

    Config = GadgetConfig
    SPACE: ClassVar[dict[str, tuple[int, ...]]] = {"size": (1, 2)}

    def __init__(self, part: str, config: GadgetConfig) -> None:
        self.part, self.config = part, config


@dataclass(kw_only=True, slots=True, frozen=True)
class Doodad:
    """A plug-in that is its own Config."""

    depth: int = 2
    """How deep."""


def _registry() -> Registry[object]:
    reg: Registry[object] = Registry("widget")
    reg.register("b")(Widget)
    reg.register("a")(lambda: "made by a")
    return reg


def test_register_and_create() -> None:
    reg = _registry()
    assert reg.names() == ["a", "b"]
    assert list(reg) == ["a", "b"]
    assert "a" in reg and "c" not in reg
    assert reg.build("a") == "made by a"
    assert reg.factory("b") is Widget
    assert reg.build("b", None, size=3).size == 3


def test_register_returns_the_factory_unchanged() -> None:
    reg: Registry[object] = Registry("widget")
    assert reg.register("w")(Widget) is Widget


def test_duplicate_name_is_rejected() -> None:
    reg = _registry()
    with pytest.raises(RegistryError, match=r"widget 'a' is registered twice"):
        reg.register("a")(Widget)
    assert reg.build("a") == "made by a"  # the first registration survives


def test_unknown_name_lists_the_allowed_names() -> None:
    with pytest.raises(RegistryError) as err:
        _registry().factory("c")
    assert str(err.value) == "unknown widget 'c'; allowed: a, b or 'module:attr'"


@pytest.mark.parametrize("ref", [f"{__name__}:Widget", "collections:OrderedDict"])
def test_module_attr_resolves_without_registration(ref: str) -> None:
    reg = _registry()
    obj = reg.factory(ref)
    assert obj.__name__ == ref.partition(":")[2]
    assert ref not in reg.names()


def test_module_attr_build_passes_arguments() -> None:
    made = _registry().build(f"{__name__}:Widget", None, size=7)
    assert isinstance(made, Widget) and made.size == 7


def test_build_validates_options_through_the_config() -> None:
    reg: Registry[object] = Registry("gadget")
    reg.register("g", space={"size": (1, 2, 4)})(Gadget)
    made = reg.build("g", {"size": "3"}, "wheel")
    assert isinstance(made, Gadget) and made.part == "wheel"
    assert made.config == GadgetConfig(size=3)
    assert reg.entry("g").config is GadgetConfig and reg.entry("g").space == {"size": (1, 2, 4)}
    assert reg.config("g", {"mode": "b"}) == GadgetConfig(mode="b")
    with pytest.raises(ConfigError) as err:
        reg.build("g", {"colour": "red"}, "wheel")
    assert str(err.value) == "gadget 'g': unknown key 'colour'; allowed: mode, size"
    with pytest.raises(ConfigError, match=r"gadget 'g': size: expected an integer, got 'x'"):
        reg.build("g", {"size": "x"}, "wheel")
    with pytest.raises(ConfigError, match=r"gadget 'g': size = 0: expected >= 1"):
        reg.build("g", {"size": 0}, "wheel")


def test_a_plugin_without_config_refuses_options() -> None:
    with pytest.raises(ConfigError, match=r"widget 'b': takes no options \(got size\)"):
        _registry().build("b", {"size": 2})


def test_module_attr_finds_its_config_and_space_on_the_class() -> None:
    reg: Registry[object] = Registry("gadget")
    entry = reg.entry(f"{__name__}:Gadget")
    assert entry.config is GadgetConfig and entry.space == {"size": (1, 2)}
    made = reg.build(f"{__name__}:Gadget", {"size": 2}, "cog")
    assert isinstance(made, Gadget) and made.config.size == 2


def test_a_dataclass_plugin_is_its_own_config() -> None:
    reg: Registry[object] = Registry("doodad")
    reg.register("d")(Doodad)
    assert reg.build("d", {"depth": "5"}) == Doodad(depth=5)
    assert reg.build(f"{__name__}:Doodad") == Doodad()
    with pytest.raises(ConfigError, match=r"doodad 'd': unknown key 'width'; allowed: depth"):
        reg.build("d", {"width": 1})


def test_a_tunable_must_be_a_config_field() -> None:
    reg: Registry[object] = Registry("gadget")
    with pytest.raises(RegistryError, match=r"gadget 'g': tunable 'speed' is no Config field"):
        reg.register("g", space={"speed": (1,)})(Gadget)


def test_builtins_load_lazily_from_the_named_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg: Registry[object] = Registry("lazy thing", "recperf_test_lazy_pkg")
    pkg = tmp_path / "recperf_test_lazy_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        f"import sys\nsys.modules[{__name__!r}].LAZY.register('late')(lambda: 'built late')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "LAZY", reg, raising=False)
    assert "recperf_test_lazy_pkg" not in sys.modules  # nothing imported it yet
    assert reg.names() == ["late"]  # the first lookup imports the package
    assert reg.build("late") == "built late"
    monkeypatch.delitem(sys.modules, "recperf_test_lazy_pkg")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("recperf_no_such_module:Thing", r"cannot import 'recperf_no_such_module'"),
        ("recperf.no_such_sub:Thing", r"cannot import 'recperf.no_such_sub'"),
        ("collections:NoSuchThing", r"'collections' has no 'NoSuchThing'"),
        ("collections:", r"'collections' has no ''"),
        ("os.path:join", r"'join' is a function, not a class"),
        ("math:pi", r"'pi' is a float, not a class"),
    ],
)
def test_bad_module_attr_names_the_reference(ref: str, message: str) -> None:
    with pytest.raises(RegistryError, match=message) as err:
        _registry().factory(ref)
    assert str(err.value).startswith(f"widget {ref!r}: ")


@pytest.mark.parametrize("ref", [":Thing", ".relative:Thing"])
def test_malformed_module_name_is_a_registry_error(ref: str) -> None:
    with pytest.raises(RegistryError):
        _registry().factory(ref)
