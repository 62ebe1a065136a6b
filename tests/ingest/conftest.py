"""One Ray instance for the ingestion tests that run the Ray engine in-process: one local node
of two logical CPUs, started at the first such test and shut down after the last test of this
package (a Ray start costs about 15 s of this suite's time; a two-node cluster twice that)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from recperf.ingest.raydata.runtime import ClusterSpec, RayRuntime


@pytest.fixture(scope="package")
def ray_runtime() -> Iterator[RayRuntime]:
    pytest.importorskip("ray.data")
    with RayRuntime(ClusterSpec(cpus_per_node=2)) as rt:
        yield rt
