"""The stall figures' names, in the one order every summary, table and figure uses."""

from __future__ import annotations

STALLS = ("data_fetch_stall_s", "data_prep_stall_s", "interconnect_stall_s", "network_stall_s")
"""The sources of stall, in the order the differential runs add them."""
FIGURES = ("compute_s", *STALLS)
"""An iteration's time split: compute without stalls, then each stall."""
