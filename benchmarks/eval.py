"""``eval``: ``inference_on_dataset`` against a hand-written no-grad loop."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
from torch import nn

from benchmarks.measure import alternate, median
from benchmarks.report import log_to_file, print_table, target_text, verdict
from benchmarks.shapes import batches_of, mapped_samples, shapes_cfg
from trainkit.evaluation import ClassificationEvaluator, inference_on_dataset
from trainkit.modeling import build_model


def _plain_inference(model: nn.Module, loader: list[Any], evaluator: Any) -> dict[str, Any]:
    evaluator.reset()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in loader:
            evaluator.process(batch, model(batch))
    model.train(was_training)
    return evaluator.evaluate() or {}


def bench_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Images/s of inference_on_dataset vs a hand-written no-grad loop."""
    quick = args.quick
    rounds = 1 if quick else 5
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = shapes_cfg()
    batch_size = 16
    loader = batches_of(mapped_samples("val", 32 if quick else 256, cfg), batch_size)
    num_images = sum(len(b) for b in loader)
    model = build_model(cfg)
    evaluator = ClassificationEvaluator("shapes_val", distributed=False)

    def timed(fn: Any) -> Any:
        def run() -> float:
            start = time.perf_counter()
            fn(model, loader, evaluator)
            return num_images / (time.perf_counter() - start)

        return run

    with tempfile.TemporaryDirectory() as out_dir, log_to_file(os.path.join(out_dir, "log.txt")):
        _plain_inference(model, loader[:1], evaluator)  # warm-up
        samples = alternate(
            {"trainkit": timed(inference_on_dataset), "plain": timed(_plain_inference)}, rounds
        )
    tk, plain = median(samples["trainkit"]), median(samples["plain"])
    ratio, target = tk / plain, 0.95
    result = {
        "images": num_images,
        "rounds": rounds,
        "samples": samples,
        "trainkit_ips": tk,
        "plain_ips": plain,
        "ratio": ratio,
        "target": target,
        "verdict": verdict(ratio, target, higher_is_better=True),
    }
    print_table(
        f"Inference: inference_on_dataset vs a hand-written no_grad loop (ImageClassifier, "
        f"{num_images} shapes_val images at {batch_size}/batch, ClassificationEvaluator in "
        f"both; medians of {rounds} alternating runs, 1 torch thread)",
        ["trainkit images/s", "hand-written images/s", "ratio", "target", "PASS/MISS"],
        [[tk, plain, ratio, target_text(target, higher_is_better=True), result["verdict"]]],
    )
    return result
