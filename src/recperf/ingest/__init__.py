"""DLRM training-data ingestion: Criteo-format data, the live pipeline, its simulator and tuners.

``Pipeline``, ``PipelineConfig``, ``Batch``, ``PipelineDataset`` (a torch IterableDataset) and
``batches`` (a plain iterator) are imported lazily (they pull in torch).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Batch", "Pipeline", "PipelineConfig", "PipelineDataset", "batches"]


def __getattr__(name: str) -> Any:
    if name == "Pipeline":
        from recperf.ingest.live.executor import Pipeline

        return Pipeline
    if name in ("PipelineConfig", "Batch"):
        from recperf.ingest.live import batch

        return getattr(batch, name)
    if name in ("PipelineDataset", "batches"):
        from recperf.ingest.live import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module 'recperf.ingest' has no attribute {name!r}")
