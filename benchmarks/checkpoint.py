"""``checkpoint``: Checkpointer save/load throughput against bare torch.save/torch.load, and
how long training is blocked per save with ``async_save`` against a synchronous save."""

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
        # ~100 MB in all: a 50 MB model and its momentum buffers.
        blocking = _bench_blocking(_model(4 if quick else 50), d, 2 * rounds + 1)
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
        "blocking": blocking,
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


# async_save must block training for at most this fraction of a synchronous save's time.
_ASYNC_BLOCKING_TARGET = 0.2


def _bench_blocking(model: nn.Module, work: str, rounds: int) -> dict[str, Any]:
    """Seconds the training thread spends in ``save()``: synchronous vs ``async_save``.

    Both checkpointers also hold an SGD optimizer with momentum (its state is copied and
    written too). Each async round waits for its background write before the next round
    (untimed), so the two cases never share the disk.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # creates the momentum buffers: as large as the model again
    sync = Checkpointer(model, work, save_to_disk=True, optimizer=optimizer)
    background = Checkpointer(model, work, save_to_disk=True, async_save=True, optimizer=optimizer)
    write_s: list[float] = []

    def timed_sync() -> float:
        start = time.perf_counter()
        sync.save("model_sync")
        return time.perf_counter() - start

    def timed_async() -> float:
        start = time.perf_counter()
        background.save("model_async")
        blocked = time.perf_counter() - start
        background.wait()
        write_s.append(time.perf_counter() - start)
        return blocked

    samples = alternate(
        {"synchronous save (baseline)": timed_sync, "async_save=True": timed_async}, rounds
    )
    state_mb = os.path.getsize(os.path.join(work, "model_async.pth")) / 1e6
    sync_s, async_s = (median(v) for v in samples.values())
    ratio = async_s / sync_s
    target = target_text(_ASYNC_BLOCKING_TARGET, higher_is_better=False)
    result = verdict(ratio, _ASYNC_BLOCKING_TARGET, higher_is_better=False)
    print_table(
        f"Training blocked per save of a {state_mb:.0f} MB state (model + SGD momentum; "
        f"{work}); medians of {rounds} alternating runs",
        ["save", "blocked (s)", "until on disk (s)", "ratio", "target", "PASS/MISS"],
        [
            ["synchronous save (baseline)", sync_s, sync_s, "", "", ""],
            ["async_save=True (host copy only)", async_s, median(write_s), "", "", ""],
            ["**async / sync blocked time**", "", "", ratio, target, result],
        ],
    )
    return {
        "state_mb": state_mb,
        "samples": samples,
        "sync_blocked_s": sync_s,
        "async_blocked_s": async_s,
        "async_until_on_disk_s": median(write_s),
        "ratio": ratio,
        "target": _ASYNC_BLOCKING_TARGET,
        "verdict": result,
    }
