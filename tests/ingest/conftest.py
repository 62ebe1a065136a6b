"""One Ray instance for the ingestion tests that run the Ray engine in-process: a local
cluster of two logical nodes of one CPU each (so placement across nodes is exercised), started
at the first such test and shut down after the last test of this package (a Ray start costs
about 15-25 s of this suite's time)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from recperf.ingest.raydata.runtime import ClusterSpec, RayRuntime


@pytest.fixture(scope="package")
def ray_runtime() -> Iterator[RayRuntime]:
    pytest.importorskip("ray.data")
    with RayRuntime(ClusterSpec(nodes=2, cpus_per_node=1)) as rt:
        yield rt
