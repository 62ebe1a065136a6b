"""Bandwidth strings for the emulated network (``netem.parse_bandwidth``): pure parsing, so it
runs everywhere, unlike the namespace tests in test_netem.py that need root."""

from __future__ import annotations

import re

import pytest

from recperf.core.errors import ConfigError
from recperf.stalls.run import netem


@pytest.mark.parametrize(
    ("text", "bits_per_s"),
    [
        ("1gbit", 1e9),
        ("200mbit", 2e8),
        ("1.5kbit", 1500.0),
        ("64bit", 64.0),
        (" 10MBit ", 1e7),  # surrounding space and case do not matter
    ],
)
def test_bandwidth_parsing(text: str, bits_per_s: float) -> None:
    assert netem.parse_bandwidth(text) == bits_per_s


@pytest.mark.parametrize("text", ["fast", "", "mbit", "10 mbit", "-1mbit", "1e3mbit", "1tbit"])
def test_bandwidth_without_a_number_and_unit_is_refused(text: str) -> None:
    expect = f"bandwidth {text!r}: expected a number and bit|kbit|mbit|gbit, e.g. 1gbit"
    with pytest.raises(ConfigError, match=f"^{re.escape(expect)}$"):
        netem.parse_bandwidth(text)


@pytest.mark.parametrize("text", ["0mbit", "0.0gbit"])
def test_zero_bandwidth_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=f"^bandwidth '{text}': must be > 0$"):
        netem.parse_bandwidth(text)


def test_a_network_refuses_a_bad_bandwidth_before_touching_the_host() -> None:
    # ConfigError from the constructor, so no root or namespace is needed to see it
    with pytest.raises(ConfigError, match=r"^bandwidth 'fast': expected a number"):
        netem.EmulatedNetwork(2, "fast")
    assert netem.EmulatedNetwork(2, "250mbit", run_id=7309).bandwidth_bits == 2.5e8
