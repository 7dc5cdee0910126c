"""Weighted mixing (``DATASETS.TRAIN_WEIGHTS``) beside one set, in the ``data`` task.

Composing optimizer steps (the batch plan alone, no loading: what mixing adds per step) for
three sets weighted ``10 : 5 : 1`` beside one set of the same records, with grouping off and
on; and the padding per batch that grouping within each set's share costs on shapes_train
(cut into three sets), beside the same records unmixed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.measure import alternate, median
from benchmarks.padding import _padding
from benchmarks.report import print_table, target_text, verdict
from benchmarks.shapes import BATCH, shapes_cfg
from trainkit.data import DatasetCatalog, TrainingSampler, build_train_loader
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.data.plans.batch_plan import GlobalBatchPlan
from trainkit.data.plans.grouping import aspect_ratio_bucket_ids
from trainkit.data.plans.mixed_sampler import MixedBatchPlan, MixedTrainingSampler

_TARGET = 1.1  # mixed / plain time per composed step
_WEIGHTS = (10, 5, 1)
_RECORDS = 160_000
_PLAN_BATCH = 64
_MIX_NAMES = ("shapes_mix_a", "shapes_mix_b", "shapes_mix_c")


def _compose_us(make_plan: Callable[[], Any], steps: int) -> Callable[[], float]:
    def run() -> float:
        plan = iter(make_plan())
        next(plan)  # the first block read is the same for both: not what is compared
        # CPU time of this process: composing is single-threaded Python, and on a shared
        # machine the wall clock also counts the time other processes ran.
        start = time.process_time()
        for _ in itertools.islice(plan, steps):
            pass
        return (time.process_time() - start) / steps * 1e6

    return run


def _plans(grouping: bool) -> dict[str, Callable[[], Any]]:
    ratios = np.random.default_rng(0).uniform(0.4, 2.5, _RECORDS)
    ids = aspect_ratio_bucket_ids(ratios, shapes_cfg().DATALOADER.ASPECT_RATIO_BINS)
    bucket_ids = ids if grouping else None
    sizes = [_RECORDS * w // sum(_WEIGHTS) for w in _WEIGHTS]
    return {
        "plain": lambda: GlobalBatchPlan(
            TrainingSampler(_RECORDS, seed=0, rank=0, world_size=1),
            _PLAN_BATCH,
            rank=0,
            world_size=1,
            bucket_ids=bucket_ids,
        ),
        "mixed": lambda: MixedBatchPlan(
            MixedTrainingSampler(sizes, _WEIGHTS, 0, rank=0, world_size=1),
            _PLAN_BATCH,
            rank=0,
            world_size=1,
            bucket_ids=bucket_ids,
        ),
    }


def _mixed_padding(batches: int, grouping: bool, divisibility: int) -> tuple[float, float]:
    """Mean padded fraction of ``batches`` batches, one set and the three-set mix."""
    records = DatasetCatalog.get("shapes_train")
    third = len(records) // 3
    for i, name in enumerate(_MIX_NAMES):
        DatasetCatalog.register(name, lambda i=i: records[i * third : (i + 1) * third])
    try:
        pads = []
        for weights in ((), _WEIGHTS):
            cfg = shapes_cfg(BATCH, 2)
            cfg.DATASETS.TRAIN = _MIX_NAMES
            cfg.DATASETS.TRAIN_WEIGHTS = weights
            cfg.DATALOADER.ASPECT_RATIO_GROUPING = grouping
            loader = build_train_loader(cfg, ClassificationDatasetMapper(cfg, is_train=True))
            taken = list(itertools.islice(iter(loader), batches))
            pads.append(float(np.mean([_padding(b, divisibility)[0] for b in taken])))
        return pads[0], pads[1]
    finally:
        for name in _MIX_NAMES:
            DatasetCatalog.remove(name)


def bench_mixing(quick: bool, rounds: int) -> dict[str, Any]:
    """Composing mixed steps beside plain ones (target <= 1.1x), and the padding it costs."""
    # A round composes for ~0.1 s, and this machine's speed drifts within seconds: many short
    # rounds, each ratio taken within its round (the two cases ran back to back).
    steps, compose_rounds = (100, 3) if quick else (1000, 3 * rounds)
    rows, results = [], {"compose": [], "padding": []}
    target = target_text(_TARGET, higher_is_better=False)
    for grouping in (False, True):
        cases = {name: _compose_us(make, steps) for name, make in _plans(grouping).items()}
        samples = alternate(cases, compose_rounds)
        plain, mixed = median(samples["plain"]), median(samples["mixed"])
        ratio = median([m / p for m, p in zip(samples["mixed"], samples["plain"])])
        v = verdict(ratio, _TARGET, higher_is_better=False)
        label = f"compose a step, µs (grouping {'on' if grouping else 'off'})"
        results["compose"].append(
            {"grouping": grouping, "plain_us": plain, "mixed_us": mixed, "ratio": ratio,
             "samples": samples, "verdict": v}
        )  # fmt: skip
        rows.append([label, plain, mixed, ratio, target, v])
    divisibility = int(shapes_cfg().MODEL.CLASSIFIER.SIZE_DIVISIBILITY)
    pad_batches = 5 if quick else 100
    for grouping in (True, False):
        one, mix = _mixed_padding(pad_batches, grouping, divisibility)
        results["padding"].append({"grouping": grouping, "one_set": one, "mixed": mix})
        label = f"padded fraction per batch (grouping {'on' if grouping else 'off'})"
        rows.append([label, one, mix, mix / one if one else float("nan"), "", ""])
    print_table(
        f"Mixing three sets 10:5:1 (DATASETS.TRAIN_WEIGHTS) beside one set: the batch plan "
        f"composing {steps} steps of {_PLAN_BATCH} from {_RECORDS:.0e} records (CPU time; "
        f"medians of {compose_rounds} alternating rounds, the ratio the median of each round's), "
        "and the padding per batch on shapes_train cut in three "
        f"({pad_batches} batches of {BATCH}; grouped: the sets share the step's bucket where they "
        "can)",
        ["measure", "one set", "mixed", "mixed / one set", "target", "PASS/MISS"],
        rows,
    )
    return results
