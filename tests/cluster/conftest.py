"""Fixtures shared by the cluster tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sweeps import CROSS_RACK_TOML


@pytest.fixture(scope="module")
def cross_rack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small cross-rack cluster of ``sweeps.CROSS_RACK_TOML``, as a TOML file."""
    path = tmp_path_factory.mktemp("clusters") / "xrack.toml"
    path.write_text(CROSS_RACK_TOML)
    return path
