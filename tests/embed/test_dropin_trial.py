"""``auto``'s first-forward pick, confirmed on the next real forwards (``dropin_trial``): which
kernels go on trial, that each runs its share of real batches with right outputs, that the
fastest median wins and is cached, and that the trial can be turned off or ends with a
rebuild."""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from recperf.core.errors import ConfigError
from recperf.embed import DropInConfig, EmbeddingBags, dropin_choice, dropin_trial
from recperf.embed.dropin_choice import Road
from recperf.embed.dropin_trial import TRIAL_MARGIN, TRIAL_MAX, TRIAL_TIE, Trial
from recperf.embed.kernel_choice import KernelChoice


def _bags() -> list[nn.EmbeddingBag]:
    torch.manual_seed(3)
    return [nn.EmbeddingBag(r, 4, mode="sum", include_last_offset=True) for r in (11, 6, 9)]


def _batch(bags: list[nn.EmbeddingBag], seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids, offs = [], []
    for bag in bags:
        lengths = torch.randint(0, 4, (5,), generator=g)
        ids.append(torch.randint(0, bag.num_embeddings, (int(lengths.sum()),), generator=g))
        offs.append(torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))
    return ids, offs


def _roads_timed_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first forward's roads timed 1, 1.1, 1.2 ms in the order the drop-in lists them."""
    first = itertools.cycle([1e-3, 1.1e-3, 1.2e-3])

    def timed(fn: object, inputs: list[object], *_: object, **__: object) -> list[float]:
        fn(inputs[0])  # type: ignore[operator]
        return [next(first)]

    monkeypatch.setattr(dropin_choice, "time_calls", timed)


def _road(kernel: str, ms: float) -> Road:
    return Road(KernelChoice(kernel=kernel, source="measured"), object(), ms)  # type: ignore[arg-type]


def test_a_trial_takes_the_roads_within_the_margin_at_most_trial_max() -> None:
    near = 1 + TRIAL_MARGIN * 0.9
    names = "abcdefg"[: TRIAL_MAX + 1]
    roads = [_road("a", 1.0), _road("b", near)] + [_road(n, 1.05) for n in names[2:]]
    trial = Trial.of(0, roads, rounds=2)
    assert trial is not None and [r.choice.kernel for r in trial.roads] == list(names[:-1])
    far = [_road("a", 1.0), _road("b", 1 + TRIAL_MARGIN * 1.1)]
    assert Trial.of(0, far, rounds=2) is None
    assert Trial.of(0, roads, rounds=0) is None
    assert Trial.of(0, [_road("a", float("nan"))], rounds=3) is None  # nothing timed


def test_auto_confirms_its_first_pick_on_the_next_forwards_and_caches_the_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The first forward ranks torch, bag-concat, bag-list (all within the margin); on the real
    forwards after it bag-list is fastest, so bag-list runs from then on, the note gives every
    kernel's median, and a new module finds bag-list in the cache."""
    real = dropin_choice.measured_choice
    monkeypatch.setattr(  # torch first, and no other kernel that pools no parts
        dropin_choice,
        "measured_choice",
        lambda *a, **k: replace(real(*a, **k), kernel="torch", timed=()),
    )
    _roads_timed_in_order(monkeypatch)  # torch, bag-concat, bag-list
    trial_ms = {"torch": 3.0, "bag-concat": 2.0, "bag-list": 1.0}
    now = [0.0]
    bags = _bags()
    cache = tmp_path / "tune.json"
    module = EmbeddingBags.from_torch(bags, "auto", config=DropInConfig(kernel="auto", cache=cache,
                                                                confirm=2))  # fmt: skip

    reads = itertools.count()

    def clock() -> float:  # each timed forward (start read, end read) lasts its kernel's entry
        trial = module._trials[0]
        k = trial.active[trial.turn // 2 % len(trial.active)]
        if next(reads) % 2:
            now[0] += trial_ms[trial.roads[k].choice.kernel] * 1e-3
        return now[0]

    monkeypatch.setattr(dropin_trial, "_clock", clock)
    ran = []
    for seed in range(14):
        ids, offs = _batch(bags, seed)
        got = module(ids, offs)
        ran.append(module.choices[0].kernel)
        with torch.no_grad():
            for a, bag, i, o in zip(got, bags, ids, offs, strict=True):
                torch.testing.assert_close(a, bag(i, o))
        if seed == 1:
            note = module.describe()[0]["note"]
            assert "on trial with torch, bag-concat, bag-list over real forwards (1 of 12" in note
    # the first forward, then two in a row each (the second timed), twice, then the verdict
    turns = ["torch", "torch", "bag-concat", "bag-concat", "bag-list", "bag-list"]
    assert ran == ["torch", *turns, *turns, "bag-list"]
    (choice,) = module.choices
    assert choice.kernel == "bag-list" and not module.on_trial
    want = "confirmed on the 12 forwards after the first (2 timed each, each after one of its "
    want += "own; medians): bag-list 1.000 ms, "
    assert want + "bag-concat 2.000 ms, torch 3.000 ms" in choice.note
    assert "on the first forward's batch torch won" in choice.note
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["kernel"] == "bag-list" and entry["ms"] == pytest.approx(1.0)
    again = EmbeddingBags.from_torch(bags, "auto", config=DropInConfig(kernel="auto", cache=cache))
    assert (again.choices[0].kernel, again.choices[0].source) == ("bag-list", "autotune cache")


def test_confirm_zero_keeps_the_first_pick_and_a_rebuild_ends_a_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _roads_timed_in_order(monkeypatch)
    winner = KernelChoice(kernel="torch", source="measured", note="torch first")
    monkeypatch.setattr(dropin_choice, "measured_choice", lambda *a, **k: winner)
    bags = _bags()
    for confirm in (0, 3):
        module = EmbeddingBags.from_torch(
            bags, "auto", config=DropInConfig(kernel="auto", cache=None, confirm=confirm)
        )
        module(*_batch(bags, 0))
        assert module.on_trial == bool(confirm)
        module(*_batch(bags, 1))
    module.rebuild()  # mid-trial: the first forward's winner runs, untried further
    assert not module.on_trial and module.choices[0].kernel == "torch"


def test_every_kernel_measured_goes_on_the_roads_and_on_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Besides the kernels that pool parts, every other kernel ``measured_choice`` timed (the
    reference, FBGEMM's TBE) is timed on the drop-in's road and, as close, tried."""
    real = dropin_choice.measured_choice
    timed: list[str] = []

    def measured(*a: object, **k: object) -> KernelChoice:
        choice = real(*a, **k)  # type: ignore[arg-type]
        timed.extend(t.kernel for t in choice.timed)
        return replace(choice, kernel="bag-list")

    monkeypatch.setattr(dropin_choice, "measured_choice", measured)
    monkeypatch.setattr(dropin_choice, "time_calls", lambda fn, inputs, *a, **k: [1e-3])
    bags = _bags()
    module = EmbeddingBags.from_torch(bags, "auto", config=DropInConfig(kernel="auto", cache=None))
    ids, offs = _batch(bags, 0)
    got = module(ids, offs)
    with torch.no_grad():
        for a, bag, i, o in zip(got, bags, ids, offs, strict=True):
            torch.testing.assert_close(a, bag(i, o))
    assert {"torch", "bag-list", "bag-concat"} <= set(timed)
    (trial,) = module._trials
    assert trial.roads[0].choice.kernel == "bag-list" and len(timed) <= TRIAL_MAX
    assert {r.choice.kernel for r in trial.roads} == set(timed)


@pytest.mark.parametrize("confirm", [-1, 1.5, True, "2"])
def test_confirm_must_be_a_whole_number_of_forwards(confirm: object) -> None:
    with pytest.raises(ConfigError, match="confirm"):
        DropInConfig(kernel="auto", confirm=confirm)  # type: ignore[arg-type]


def test_forwards_from_several_threads_during_a_trial_pool_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    winner = KernelChoice(kernel="torch", source="measured", note="torch first")
    monkeypatch.setattr(dropin_choice, "measured_choice", lambda *a, **k: winner)
    monkeypatch.setattr(dropin_choice, "time_calls", lambda fn, inputs, *a, **k: [1e-3])
    bags = _bags()
    module = EmbeddingBags.from_torch(bags, "auto", config=DropInConfig(kernel="auto", cache=None,
                                                                confirm=4))  # fmt: skip
    module(*_batch(bags, 0))
    assert module.on_trial
    batches = [_batch(bags, s) for s in range(45)]  # 24 forwards, 16 more where two came close
    errors: list[BaseException] = []

    def work(part: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> None:
        try:
            for ids, offs in part:
                got = module(ids, offs)
                with torch.no_grad():
                    for a, bag, i, o in zip(got, bags, ids, offs, strict=True):
                        torch.testing.assert_close(a, bag(i, o))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(batches[k::3],)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not module.on_trial
    assert re.search(r"confirmed on the (24|40) forwards after the first", module.choices[0].note)


@pytest.mark.parametrize("gap", [TRIAL_TIE / 2, TRIAL_TIE * 2])
def test_the_two_fastest_run_again_where_they_came_close(
    monkeypatch: pytest.MonkeyPatch, gap: float
) -> None:
    """Three kernels, ``rounds`` timed forwards each; where the two fastest came within
    ``TRIAL_TIE`` those two run ``rounds`` more each (once) and the verdict counts all their
    forwards: here the runner-up is faster in the second stage and wins."""
    names = ("a", "b", "c")
    trial = Trial.of(0, [_road(n, 1.0) for n in names], rounds=2)
    assert trial is not None
    ms = {"a": [1.0, 1.0, 1.2, 1.2], "b": [1.0 + gap] * 2 + [0.9, 0.9], "c": [3.0, 3.0]}
    now = [0.0]
    reads = itertools.count()

    class Group:  # what Trial touches of a drop-in's group
        tables = type("T", (), {"device": torch.device("cpu")})()

        def run(self, choice: KernelChoice, kernel: object) -> None:
            self.kernel = choice.kernel

    group = Group()

    def clock() -> float:
        if next(reads) % 2:  # the end of a timed forward: its kernel's next entry
            k = group.kernel
            now[0] += ms[k][len(trial.seconds[names.index(k)])] * 1e-3
        return now[0]

    monkeypatch.setattr(dropin_trial, "_clock", clock)
    ran = []
    while not trial.done:
        trial.time(group, lambda: ran.append(group.kernel))  # type: ignore[arg-type]
    first = ["a", "a", "b", "b", "c", "c"] * 2
    if gap > TRIAL_TIE:  # far apart: a wins the first stage
        assert ran == first and trial.active == (0, 1, 2)
        return
    assert ran == first + ["a", "a", "b", "b"] * 2 and trial.active == (0, 1)
    monkeypatch.setattr(dropin_trial, "record_winner", lambda *a, **k: None)
    choice = trial.finish(group, DropInConfig(kernel="auto", cache=None))  # type: ignore[arg-type]
    assert choice.kernel == "b"  # medians over 4 forwards: b 0.95 ms, a 1.1 ms
    assert "2 timed each, a and b 4: they came within 10%" in choice.note


def test_a_trial_times_a_tbe_layout_batch_on_the_short_road(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the TBE layout, each kernel on trial pools on the road it runs once chosen: a
    kernel that pools parts takes the batch whole (``pool_flat``), never cut per bag."""
    from recperf.embed.kernels.bagconcat import BagConcat
    from recperf.embed.kernels.baglist import BagList

    winner = KernelChoice(kernel="torch", source="measured", note="torch first")
    monkeypatch.setattr(dropin_choice, "measured_choice", lambda *a, **k: winner)
    monkeypatch.setattr(dropin_choice, "time_calls", lambda fn, inputs, *a, **k: [1e-3])
    monkeypatch.setattr(dropin_trial, "TRIAL_TIE", 0.0)  # one stage: 6 forwards
    bags = _bags()
    module = EmbeddingBags.from_torch(bags, "auto", config=DropInConfig(kernel="auto", cache=None,
                                                                confirm=1))  # fmt: skip
    batches = []
    for seed in range(12):
        ids, offs = _batch(bags, seed)
        starts = [0, *itertools.accumulate(int(i.numel()) for i in ids)]
        flat_offs = torch.cat([*(o[:-1] + s for o, s in zip(offs, starts, strict=False)),
                               torch.tensor([starts[-1]])])  # fmt: skip
        batches.append((ids, offs, torch.cat(ids), flat_offs))
    module(*batches[0][2:])  # measures: a trial of torch, bag-concat, bag-list
    assert module.on_trial
    roads: list[str] = []
    for cls in (BagConcat, BagList):
        flat = cls.pool_flat
        monkeypatch.setattr(
            cls, "pool_flat", lambda k, *a, r=flat: roads.append("flat") or r(k, *a)
        )
    cut = EmbeddingBags._cut
    monkeypatch.setattr(EmbeddingBags, "_cut", lambda m, lk: roads.append("cut") or cut(m, lk))
    for ids, offs, flat_ids, flat_offs in batches[1:]:
        got = module(flat_ids, flat_offs)
        with torch.no_grad():
            for a, bag, i, o in zip(got, bags, ids, offs, strict=True):
                torch.testing.assert_close(a, bag(i, o))
    assert not module.on_trial and roads.count("flat") >= 2 and "cut" not in roads
