"""The generator's formats and bounds and the bundled simulator specs' names, apart from the
generator and the simulator so that the CLI can name them in its help without importing pyarrow
or numpy."""

from __future__ import annotations

FORMATS = ("parquet", "tsv")
"""The shard formats ``generate`` writes."""
MAX_ROWS = 10**10
"""The most rows ``generate`` writes (about twice Criteo Terabyte's 4.4 billion)."""
BUNDLED_SPECS = (
    "criteo-16",
    "udf-64",
    "membound-128",
    "live-2",
    "udfcut-4",
    "threads-2",
    "ray-65540",
)
"""The simulator specs bundled in ``recperf/data/ingest`` (``sim.model.BUNDLED``)."""
