"""Padding per batch, and the classifier's step time, with each way of batching (``data``).

Part of the ``data`` task: grouping by aspect ratio with trainkit's default bins beside
detectron2's two buckets and no grouping, with one rescale factor per batch or per image.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from typing import Any

import numpy as np
import torch

from benchmarks.measure import alternate, median
from benchmarks.report import print_table, target_text, verdict
from benchmarks.shapes import BATCH, shapes_cfg, train_loader
from trainkit.modeling import build_model
from trainkit.solver import build_optimizer


def _padding(batch: list[dict[str, Any]], divisibility: int) -> tuple[float, float]:
    """Padded fraction of the batch tensor: to the batch max, and after rounding up."""
    hs = [s["image"].shape[1] for s in batch]
    ws = [s["image"].shape[2] for s in batch]
    real = sum(h * w for h, w in zip(hs, ws))
    H, W = max(hs), max(ws)
    Hd, Wd = (math.ceil(v / divisibility) * divisibility for v in (H, W))
    return 1 - real / (len(batch) * H * W), 1 - real / (len(batch) * Hd * Wd)


def bench_padding(quick: bool, rounds: int) -> dict[str, Any]:
    """Padded fraction per batch and step time for each batching mode."""
    results: dict[str, Any] = {"padding": []}
    # Padding and the model's step time with each way of batching.
    torch.set_num_threads(1)
    cfg = shapes_cfg(BATCH)
    divisibility = int(cfg.MODEL.CLASSIFIER.SIZE_DIVISIBILITY)
    modes = {
        f"grouping, default bins {list(cfg.DATALOADER.ASPECT_RATIO_BINS)}": lambda: train_loader(
            2, True
        ),
        "grouping, two buckets [1.0] (detectron2)": lambda: train_loader(2, True, [1.0]),
        "no grouping": lambda: train_loader(2, False),
        # With a rescale factor drawn per image (INPUT.RANDOM_SCALE_PER_BATCH False), images
        # of one aspect ratio still differ in size, and no grouping decided before the
        # mapper runs can remove that padding: these rows measure how much it is.
        "grouping, default bins, rescale per image": lambda: train_loader(
            2, True, scale_per_batch=False
        ),
        "no grouping, rescale per image": lambda: train_loader(2, False, scale_per_batch=False),
    }
    pad_batches = 5 if quick else 100
    step_batches = 2 if quick else 8
    collected = {
        name: list(itertools.islice(iter(make()), pad_batches)) for name, make in modes.items()
    }
    torch.manual_seed(0)
    template = build_model(cfg)

    def step_time(batches: list[Any]) -> Any:
        def run() -> float:
            model = copy.deepcopy(template)
            optimizer = build_optimizer(cfg, model)
            model.train()
            start = time.perf_counter()
            for batch in batches:
                loss = sum(model(batch).values())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return (time.perf_counter() - start) / len(batches)

        return run

    steps = alternate({name: step_time(b[:step_batches]) for name, b in collected.items()}, rounds)
    names = list(modes)
    pads = {n: np.mean([_padding(b, divisibility) for b in collected[n]], axis=0) for n in names}
    none = pads["no grouping"]
    rows = []
    for n in names:
        row = {
            "mode": n,
            "padded_to_max": float(pads[n][0]),
            "padded_after_divisibility": float(pads[n][1]),
            "step_s": median(steps[n]),
            "step_samples": steps[n],
        }
        results["padding"].append(row)
        rows.append([n, pads[n][0], pads[n][1], row["step_s"] * 1e3])
    default, two = pads[names[0]][0], pads[names[1]][0]
    per_image = pads[names[3]][0] / pads[names[4]][0]
    checks = [
        ("default bins: padding vs no grouping", default / none[0], 0.5),
        ("default bins: padding vs two buckets", default / two, 1.0),
        ("rescale per image: default bins vs no grouping (informational)", per_image, None),
    ]
    results["padding_checks"] = []
    for label, ratio, target in checks:
        if target is None:
            v, shown = "", ""
        elif target == 1.0:
            v = "PASS" if ratio < 1.0 else "MISS"  # "below": strictly less
            shown = "< 1"
        else:
            v = verdict(ratio, target, higher_is_better=False)
            shown = target_text(target, higher_is_better=False)
        results["padding_checks"].append(
            {"label": label, "ratio": ratio, "target": shown, "verdict": v}
        )
        rows.append([f"**{label}**", ratio, "", "", shown, v])
    for r in rows[: len(names)]:
        r.extend(["", ""])
    print_table(
        f"Padding per batch ({pad_batches} batches of {BATCH}, images after the random rescale; "
        f"'after rounding': padded to a multiple of SIZE_DIVISIBILITY={divisibility}) and "
        f"ImageClassifier step time ({step_batches} batches, medians of {rounds} rounds, "
        "1 torch thread)",
        [
            "batching",
            "padded fraction (to batch max)",
            "padded fraction after rounding",
            "step ms",
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    return results
