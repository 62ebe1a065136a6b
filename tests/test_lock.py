"""The install lock (requirements/lock.txt): what is installed here is exactly what is locked.

`make` installs every package with `-c requirements/lock.txt`, so after `make test` on a fresh
machine `pip freeze` equals the lock for every locked name. These tests check that, that the lock
still covers pyproject.toml's requirements, and that the check itself catches a wrong version.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def read_lock(text: str) -> dict[str, str]:
    """Normalised name -> locked version; every line that is not a comment must be NAME==VERSION."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        if match is None:
            raise ValueError(f"lock line {number} is not NAME==VERSION: {raw!r}")
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def installed_versions(names: list[str]) -> dict[str, str]:
    """The version of each name that is installed in the running environment."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def mismatches(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per installed package whose version is not the locked one.

    Compared as pip compares a constraint (PEP 440): a locked `2.13.0` accepts any local build of
    that release such as `2.13.0+cpu`, and a locked `2.13.0+cpu` accepts that build only.
    """
    return [
        f"{name}: locked {version}, installed {installed[name]}"
        for name, version in sorted(locked.items())
        if name in installed
        and not SpecifierSet(f"=={version}").contains(installed[name], prereleases=True)
    ]


@pytest.fixture(scope="module")
def locked() -> dict[str, str]:
    return read_lock(LOCK.read_text())


def test_every_locked_package_installed_here_has_its_locked_version(
    locked: dict[str, str],
) -> None:
    installed = installed_versions(list(locked))
    assert {"torch", "numpy", "pyarrow", "typer", "rich"} <= installed.keys()
    assert mismatches(locked, installed) == []


def test_a_tampered_lock_is_caught(locked: dict[str, str]) -> None:
    installed = installed_versions(list(locked))
    text = re.sub(r"(?m)^numpy==\S+$", "numpy==1.0.0", LOCK.read_text())
    text = re.sub(r"(?m)^torch==([^+\s]+)\S*$", r"torch==\1+cu128", text)
    before = {line.split(":")[0] for line in mismatches(locked, installed)}
    after = {line.split(":")[0] for line in mismatches(read_lock(text), installed)}
    assert after - before == {"numpy", "torch"}


def test_local_version_labels_are_compared_as_pip_does() -> None:
    assert mismatches({"torch": "2.13.0"}, {"torch": "2.13.0+cpu"}) == []
    assert mismatches({"torch": "2.13.0+cpu"}, {"torch": "2.13.0+cpu"}) == []
    assert mismatches({"torch": "2.13.0+cpu"}, {"torch": "2.13.0"}) != []
    assert mismatches({"torch": "2.13.0+cpu"}, {"torch": "2.13.1+cpu"}) != []
    assert mismatches({"torch": "2.13.0"}, {}) == []


def test_a_line_that_is_not_a_pin_is_refused() -> None:
    with pytest.raises(ValueError, match="lock line 2 is not NAME==VERSION"):
        read_lock("numpy==2.4.6\npandas>=3\n")


def test_the_lock_covers_pyproject_and_fits_its_ranges(locked: dict[str, str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in locked, f"{name} is not in the lock: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), f"{spec} vs the lock"


def test_every_package_the_makefile_names_is_locked(locked: dict[str, str]) -> None:
    named = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "$(PIP) " in line:
            words = line.split("$(PIP) ", 1)[1].split()
            named |= {canonicalize_name(w.split("==")[0]) for w in words if w[0].isalpha()}
    assert {"torch", "fbgemm-gpu-cpu", "torchrec", "tensordict"} <= named
    assert sorted(named - locked.keys()) == []
