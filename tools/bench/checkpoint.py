"""``checkpoint``: Checkpointer save/load throughput against bare torch.save/torch.load."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
from _bench_utils import alternate, log_to_file, median, print_table, target_text, verdict
from torch import nn

from trainkit.checkpoint import Checkpointer


def _model(mb: int) -> nn.Module:
    # 1024x1024 float32 linears: 4 MiB each.
    return nn.Sequential(*[nn.Linear(1024, 1024, bias=True) for _ in range(max(1, mb // 4))])


def bench_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Save (atomic, fsynced) and load (weights_only, into the model) MB/s vs bare torch."""
    quick = args.quick
    rounds = 1 if quick else 7  # fsync times vary run to run; medians of 7 settle them
    model = _model(8 if quick else 100)
    work = args.workdir or tempfile.gettempdir()
    with (
        tempfile.TemporaryDirectory(prefix="trainkit-bench-ckpt-", dir=work) as d,
        log_to_file(os.path.join(d, "log.txt")),
    ):
        checkpointer = Checkpointer(model, d, save_to_disk=True)
        tk_path, bare_path = os.path.join(d, "model_tk.pth"), os.path.join(d, "bare.pth")

        def timed(fn: Any, path: str) -> Any:
            def run() -> float:
                start = time.perf_counter()
                fn()
                return os.path.getsize(path) / 1e6 / (time.perf_counter() - start)

            return run

        def bare_save_fsync() -> None:
            with open(bare_path, "wb") as f:
                torch.save(model.state_dict(), f)
                f.flush()
                os.fsync(f.fileno())

        save = alternate(
            {
                "trainkit Checkpointer.save (atomic: temp, fsync, rename, tag)": timed(
                    lambda: checkpointer.save("model_tk"), tk_path
                ),
                "torch.save(state_dict, path)": timed(
                    lambda: torch.save(model.state_dict(), bare_path), bare_path
                ),
                "torch.save + fsync": timed(bare_save_fsync, bare_path),
            },
            rounds,
        )
        load = alternate(
            {
                "trainkit Checkpointer.load (weights_only, into the model)": timed(
                    lambda: checkpointer.load(tk_path), tk_path
                ),
                "torch.load(weights_only=True)": timed(
                    lambda: torch.load(bare_path, map_location="cpu", weights_only=True), bare_path
                ),
                "torch.load(weights_only=True) + load_state_dict": timed(
                    lambda: model.load_state_dict(
                        torch.load(bare_path, map_location="cpu", weights_only=True)
                    ),
                    bare_path,
                ),
            },
            rounds,
        )
        size_mb = os.path.getsize(tk_path) / 1e6
    med = {k: median(v) for k, v in {**save, **load}.items()}
    save_names, load_names = list(save), list(load)
    checks = [
        ("save vs torch.save + fsync", med[save_names[0]] / med[save_names[2]], 0.8),
        (
            "save vs torch.save (no fsync; informational)",
            med[save_names[0]] / med[save_names[1]],
            None,
        ),
        ("load vs torch.load", med[load_names[0]] / med[load_names[1]], 0.9),
        (
            "load vs torch.load + load_state_dict (same work)",
            med[load_names[0]] / med[load_names[2]],
            0.9,
        ),
    ]
    rows = [[name, med[name], "", "", ""] for name in save_names + load_names]
    for label, ratio, target in checks:
        rows.append(
            [
                f"**{label}**",
                "",
                ratio,
                "" if target is None else target_text(target, higher_is_better=True),
                "" if target is None else verdict(ratio, target, higher_is_better=True),
            ]
        )
    print_table(
        f"Checkpoint of a {size_mb:.0f} MB model state ({work}, page cache warm for loads); "
        f"medians of {rounds} alternating runs",
        ["operation", "MB/s", "ratio", "target", "PASS/MISS"],
        rows,
    )
    return {
        "size_mb": size_mb,
        "rounds": rounds,
        "samples": {**save, **load},
        "medians": med,
        "ratios": [
            {
                "label": label,
                "ratio": ratio,
                "target": target,
                "verdict": None
                if target is None
                else verdict(ratio, target, higher_is_better=True),
            }
            for label, ratio, target in checks
        ],
    }
