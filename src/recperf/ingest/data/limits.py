"""The generator's formats and bounds, apart from the generator so that the CLI can name them
in its help without importing pyarrow."""

from __future__ import annotations

FORMATS = ("parquet", "tsv")
"""The shard formats ``generate`` writes."""
MAX_ROWS = 10**10
"""The most rows ``generate`` writes (about twice Criteo Terabyte's 4.4 billion)."""
