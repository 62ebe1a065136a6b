"""Registry: registration, duplicates, unknown names and ``module:attr`` entry points."""

from __future__ import annotations

import pytest

from recperf.core.errors import RegistryError
from recperf.core.registry import Registry


class Widget:
    """A plug-in reachable as ``test_registry:Widget``."""

    def __init__(self, size: int = 1) -> None:
        self.size = size


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
    assert reg.create("a") == "made by a"
    assert reg.factory("b") is Widget
    assert reg.create("b", size=3).size == 3


def test_register_returns_the_factory_unchanged() -> None:
    reg: Registry[object] = Registry("widget")
    assert reg.register("w")(Widget) is Widget


def test_duplicate_name_is_rejected() -> None:
    reg = _registry()
    with pytest.raises(RegistryError, match=r"widget 'a' is registered twice"):
        reg.register("a")(Widget)
    assert reg.create("a") == "made by a"  # the first registration survives


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


def test_module_attr_create_passes_arguments() -> None:
    made = _registry().create(f"{__name__}:Widget", size=7)
    assert isinstance(made, Widget) and made.size == 7


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("recperf_no_such_module:Thing", r"cannot import 'recperf_no_such_module'"),
        ("recperf.no_such_sub:Thing", r"cannot import 'recperf.no_such_sub'"),
        ("collections:NoSuchThing", r"'collections' has no 'NoSuchThing'"),
        ("collections:", r"'collections' has no ''"),
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
