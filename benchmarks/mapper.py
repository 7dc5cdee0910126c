"""``mapper``: the default DatasetMapper (ResizeShortestEdge + RandomFlip) per shapes image.

trainkit's ``DatasetMapper(cfg, True)`` runs as a loader runs it, inside each record's
sample context (which also seeds ``np.random`` and ``random``). The baseline is
detectron2's ``DatasetMapper`` doing the same work when ``--d2-root`` names a detectron2
source checkout, otherwise the same work written with plain PIL and numpy. A second table
gives the per-record cost of seeding the global generators beside the mapper's time.

What the plain baseline stands for: the pixel work of detectron2's mapper, done the way its
``read_image`` and ``ResizeTransform`` do it (PIL open, EXIF read, ``convert("RGB")``, BGR as
the reversed view ``[:, :, ::-1]``, a bilinear PIL resize to the same size, a flip drawn from
``np.random``, a contiguous CHW tensor), without the rest of detectron2's per-call work: its
``copy.deepcopy`` of the record (the baseline copies it shallowly, as trainkit does), its
iopath open, its ``AugInput``/``Augmentation``/``TransformList`` objects and
``np.random.choice`` of the one training size. It is therefore a stricter bar than
detectron2's mapper itself, which does all of the above on top.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.measure import alternate, median
from benchmarks.report import print_table, target_text, verdict
from trainkit.config import CfgNode, get_cfg
from trainkit.data import DatasetCatalog, DatasetMapper
from trainkit.data.mapping.record_mapper import sample_context, seed_global_generators

SIZE = 64  # shorter side after resizing, and the cap on the longer one (Base-Shapes.yaml)


def _cfg() -> CfgNode:
    cfg = get_cfg()
    cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING = (SIZE,), "choice"
    cfg.INPUT.MAX_SIZE_TRAIN, cfg.INPUT.FORMAT = SIZE, "BGR"  # detectron2's format
    cfg.INPUT.RANDOM_FLIP = "horizontal"
    return cfg


def _plain_mapper(record: dict[str, Any]) -> dict[str, Any]:
    """The same work with PIL and numpy only: read, resize the shorter side, flip, tensor."""
    from PIL import Image

    with open(record["file_name"], "rb") as f:
        image = Image.open(f)
        image.getexif()  # detectron2 reads the EXIF orientation too
        pixels = np.asarray(image.convert("RGB"))[:, :, ::-1]
    h, w = pixels.shape[:2]
    scale = min(SIZE / min(h, w), SIZE / max(h, w))
    size = (int(w * scale + 0.5), int(h * scale + 0.5))
    resized = np.asarray(Image.fromarray(np.ascontiguousarray(pixels)).resize(size, 2))
    if np.random.rand() < 0.5:
        resized = resized[:, ::-1]
    out = dict(record)
    out["image"] = torch.as_tensor(np.ascontiguousarray(resized.transpose(2, 0, 1)))
    return out


def _d2_mapper(d2_root: str, cfg: CfgNode) -> Callable[[dict[str, Any]], Any]:
    """detectron2's DatasetMapper from a source checkout, with the same augmentations."""
    sys.path.insert(0, d2_root)
    try:
        from detectron2.data import transforms as d2_transforms
        from detectron2.data.dataset_mapper import DatasetMapper as D2Mapper
    except ImportError as e:
        raise SystemExit(
            f"--d2-root {d2_root}: cannot import detectron2's DatasetMapper ({e})"
        ) from None
    augs = [
        d2_transforms.ResizeShortestEdge(SIZE, SIZE, "choice"),
        d2_transforms.RandomFlip(horizontal=True),
    ]
    return D2Mapper(is_train=True, augmentations=augs, image_format=cfg.INPUT.FORMAT)


def _per_image_us(
    fn: Callable[[dict[str, Any], int], Any], records: list[Any]
) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for position, record in enumerate(records):
            fn(record, position)
        return (time.perf_counter() - start) / len(records) * 1e6

    return run


def _seeding_us(calls: int) -> dict[str, float]:
    """Microseconds per record: the whole sample context, and its seeding of the globals."""
    start = time.perf_counter()
    for position in range(calls):
        seed_global_generators(0, position)
    seeding = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for position in range(calls):
        with sample_context(0, position):
            pass
    context = (time.perf_counter() - start) / calls * 1e6
    # What trainkit does not do: save both states before a record and restore them after.
    start = time.perf_counter()
    for _ in range(calls):
        saved = np.random.get_state(), random.getstate()
        np.random.set_state(saved[0])
        random.setstate(saved[1])
    restoring = (time.perf_counter() - start) / calls * 1e6
    return {"seeding_us": seeding, "context_us": context, "restore_us": restoring}


def bench_mapper(args: argparse.Namespace) -> dict[str, Any]:
    """Per-image time of the default DatasetMapper against detectron2's or plain PIL/numpy."""
    quick = args.quick
    rounds = 1 if quick else 7
    torch.set_num_threads(1)
    records = DatasetCatalog.get("shapes_train")[: 24 if quick else 400]
    cfg = _cfg()
    mapper = DatasetMapper(cfg, True)

    def trainkit(record: dict[str, Any], position: int) -> Any:
        with sample_context(0, position):  # as a loader maps it
            return mapper(record)

    d2_root = getattr(args, "d2_root", None)
    if d2_root:
        base, base_name = _d2_mapper(d2_root, cfg), "detectron2 DatasetMapper"
    else:
        base, base_name = _plain_mapper, "plain PIL/numpy"
    np.random.seed(0)
    random.seed(0)
    cases = {
        "trainkit": _per_image_us(trainkit, records),
        "baseline": _per_image_us(lambda record, _: base(record), records),
    }
    for case in cases.values():  # warm-up: file cache, first PIL calls
        case()
    samples = alternate(cases, rounds)
    tk_us, base_us = median(samples["trainkit"]), median(samples["baseline"])
    ratio, target = base_us / tk_us, 0.95  # trainkit's speed relative to the baseline's
    mapper_check = verdict(ratio, target, higher_is_better=True)
    print_table(
        f"Default mapper per image: trainkit DatasetMapper vs {base_name} (ResizeShortestEdge "
        f"{SIZE} capped at {SIZE} + RandomFlip, BGR, {len(records)} shapes_train images; "
        f"medians of {rounds} alternating rounds; speed ratio = baseline time / trainkit time)",
        ["trainkit us/image", "baseline us/image", "speed ratio", "target", "PASS/MISS"],
        [[tk_us, base_us, ratio, target_text(target, higher_is_better=True), mapper_check]],
    )
    cost = _seeding_us(2_000 if quick else 100_000)
    share, share_target = cost["seeding_us"] / tk_us, 0.05
    share_check = verdict(share, share_target, higher_is_better=False)
    print_table(
        "Seeding np.random and random per record (sample_context, every mapped record): "
        "cost beside a mapped image",
        ["seeding us/record", "whole sample context us/record",
         "saving + restoring both (not done) us/record", "mapper us/image",
         "share of a mapped image", "target", "PASS/MISS"],
        [[cost["seeding_us"], cost["context_us"], cost["restore_us"], tk_us, share,
          target_text(share_target, higher_is_better=False), share_check]],
    )  # fmt: skip
    return {
        "baseline": base_name,
        "images": len(records),
        "rounds": rounds,
        "samples": samples,
        "trainkit_us": tk_us,
        "baseline_us": base_us,
        "ratio": ratio,
        "target": target,
        "verdict": mapper_check,
        **cost,
        "seeding_share": share,
        "seeding_target": share_target,
        "seeding_verdict": share_check,
    }
