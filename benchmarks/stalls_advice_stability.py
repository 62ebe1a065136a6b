"""Does the report's cloud recommendation hold between identical runs (issue 28)?

Builds the report's stalls section (the full default: dlrm, 2 ranks on 2 emulated machines at
500 Mbit/s, the microbenchmark again at 2 Gbit/s) ``--repeats`` times and records, per run: the
section's wall time, the fitted model (held and unmeasured terms, residual spread), the data
stall the advice carried and the differential one it did not, and the recommendation with its
interval and verdict. It also re-advises each run's profile the old way (the differential data
stall carried, as before issue 28) to show what moved the recommendation.

    python benchmarks/stalls_advice_stability.py [--repeats 2] [--out FILE.json]

Needs root for the emulated machines (without it the section profiles one machine).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from recperf.report import stalls_section as st
from recperf.stalls import study
from recperf.stalls.cost.advisor import AdvisorConfig, ProfileSummary, advise
from recperf.stalls.model.comm import CommModel
from recperf.stalls.study import BUDGET_H, EPOCH_SAMPLES


def one_run() -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    real = study.profile

    def capture(config: Any, out: Path, progress: Any = None) -> Any:
        summary = real(config, out, progress)
        seen.append(summary.to_json())
        return summary

    study.profile = capture
    try:
        t0 = time.perf_counter()
        section = st.stalls_section()
        wall = time.perf_counter() - t0
    finally:
        study.profile = real
    (summary,) = seen
    data = section.data
    advice = data["advice"]
    rec = advice["recommendation"]
    old = dict(summary)
    old.pop("direct", None)  # the advisor then carries the differential fetch + prep stall
    fit = data["comm_model_fit"]
    model = None if fit is None else CommModel.from_json(fit)
    config = AdvisorConfig(budget_h=BUDGET_H, epoch_samples=EPOCH_SAMPLES["dlrm"])
    old_rec = advise(ProfileSummary.from_mapping(old), config, model=model).recommendation
    return {
        "section_wall_s": wall,
        "host_load_1min": summary.get("host_load_1min"),
        "comm_model": fit,
        "data_stall_carried_s": summary["direct"]["data_stall_s"],
        "data_stall_differential_s": summary["data_fetch_stall_s"] + summary["data_prep_stall_s"],
        "recommendation": None
        if rec is None
        else {
            k: rec[k]
            for k in (
                "instance",
                "count",
                "total_h",
                "total_low_h",
                "total_high_h",
                "verdict",
                "cost_usd",
            )
        },
        "recommendation_with_differential_data_stall": None
        if old_rec is None
        else {"instance": old_rec.instance, "count": old_rec.count, "total_h": old_rec.total_h},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runs = [one_run() for _ in range(args.repeats)]
    text = json.dumps({"runs": runs}, indent=1, sort_keys=True)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
