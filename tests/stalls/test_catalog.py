"""The cloud catalog: bundled tables load, bad rows name file, line and field, and the Pareto
frontier keeps exactly the undominated setups."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recperf.core.errors import TraceFormatError
from recperf.stalls.cost.catalog import load_gpu_models, load_instances, pareto_front


def test_bundled_catalog_loads() -> None:
    instances = load_instances()
    gpus = load_gpu_models()
    assert {i.instance for i in instances} >= {"p3.2xlarge", "p4d.24xlarge", "p5.48xlarge"}
    assert all(i.gpu_model in gpus for i in instances)
    p4d = next(i for i in instances if i.instance == "p4d.24xlarge")
    assert (p4d.gpus, p4d.gpu_model, p4d.network_gbps) == (8, "A100", 400)
    assert gpus["H100"].tensor_fp16_tflops == 989


@pytest.mark.parametrize(
    ("row", "field", "why"),
    [
        ("x,eight,V100,16,none,10,3.0", "gpus", "expected an integer >= 1, got 'eight'"),
        ("x,0,V100,16,none,10,3.0", "gpus", "expected an integer >= 1, got '0'"),
        ("x,8,V100,16,warp,10,3.0", "intra_node_link", "not one of"),
        ("x,8,V100,16,none,10,-1", "usd_per_hour", "expected a finite number > 0, got '-1'"),
        ("x,8,V100,16,none,10,nan", "usd_per_hour", "expected a finite number > 0, got 'nan'"),
        ("x,8,V100,16,none,10,0", "usd_per_hour", "expected a finite number > 0, got '0'"),
        ("x,8,V100,inf,none,10,3.0", "gpu_mem_gib", "expected a finite number > 0, got 'inf'"),
    ],
)
def test_bad_catalog_rows_name_line_and_field(
    tmp_path: Path, row: str, field: str, why: str
) -> None:
    path = tmp_path / "cat.csv"
    header = "instance,gpus,gpu_model,gpu_mem_gib,intra_node_link,network_gbps,usd_per_hour"
    path.write_text(f"{header}\np3.2xlarge,1,V100,16,none,10,3.06\n{row}\n")
    with pytest.raises(TraceFormatError, match=why) as err:
        load_instances(path)
    assert err.value.line == 3 and err.value.field == field


def test_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "cat.csv"
    path.write_text("instance,gpus\nx,1\n")
    with pytest.raises(TraceFormatError, match="column missing") as err:
        load_instances(path)
    assert err.value.field == "gpu_model"


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), max_size=30))
def test_pareto_front_is_exactly_the_undominated_points(points: list[tuple[int, int]]) -> None:
    front = pareto_front(points, key=lambda p: (float(p[0]), float(p[1])))

    def dominated(p: tuple[int, int]) -> bool:
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)

    assert set(front) == {p for p in points if not dominated(p)}
    assert [p[0] for p in front] == sorted(p[0] for p in front)
