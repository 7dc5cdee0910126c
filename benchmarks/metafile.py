"""``metafile``: records read on demand from a JSON-lines file through a line index.

``build_line_index`` (a vectorised newline scan) beside the plain way of indexing a file in
Python (a list of line offsets built line by line); then random reads through
``MetaFileDataset`` and ``RankDataset`` beside reads through that offsets list (seek,
readline, ``json.loads``): private memory growth, records/s and the time to open.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import numpy as np

from benchmarks.measure import MiB, run_forked, self_memory, timer
from benchmarks.report import all_met, print_table, target_text, verdict

_INDEX_TARGET_MB_S = 200.0
_ANON_TARGET_MIB = 64.0
_READS_TARGET_K_S = 50.0
_BASELINE = "baseline: offsets in a Python list (seek, readline, json.loads)"


def _write_meta_file(path: str, n: int) -> None:
    block = 1_000_000
    with open(path + ".tmp", "w") as f:
        for lo in range(0, n, block):
            f.write(
                "".join(
                    f'{{"file_name": "images/{i:08d}.jpg", "image_id": {i}, "height": 480, '
                    f'"width": 640, "category_id": {i % 80}}}\n'
                    for i in range(lo, min(n, lo + block))
                )
            )
    os.replace(path + ".tmp", path)


def _line_offsets(path: str) -> list[int]:
    """The baseline index: the byte offset of every line, in a Python list."""
    offsets, position = [], 0
    with open(path, "rb") as f:
        for line in f:
            offsets.append(position)
            position += len(line)
    return offsets


class _OffsetListDataset:
    """The baseline reader: records at the offsets of :func:`_line_offsets`."""

    def __init__(self, path: str) -> None:
        self.offsets = _line_offsets(path)
        self.file = open(path, "rb")  # held open for the reads

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> Any:
        self.file.seek(self.offsets[i])
        return json.loads(self.file.readline())


def _random_reads(kind: str, path: str, reads: int, seed: int) -> dict[str, float]:
    """Runs in a fresh forked process: open, then read ``reads`` random records."""
    from trainkit.data import MetaFileDataset, RankDataset

    before = self_memory()
    with timer() as elapsed:
        if kind == "MetaFileDataset":
            ds: Any = MetaFileDataset(path)
        elif kind == _BASELINE:
            ds = _OffsetListDataset(path)
        else:
            mini = int(kind.split("mini_epochs=")[1].rstrip(")"))
            ds = RankDataset(path, seed=0, mini_epochs=mini, world_size=2, rank=seed % 2)
        n = len(ds)  # RankDataset: loads this rank's share here
        open_s = elapsed()
    idx = np.random.default_rng(seed).integers(0, n, reads).tolist()
    with timer() as elapsed:
        for i in idx:
            ds[i]
        rate = reads / elapsed()
    after = self_memory()
    return {
        "open_s": open_s,
        "rate": rate,
        "anon_growth": (after["anon"] - before["anon"]) / MiB,
        "uss_growth": (after["uss"] - before["uss"]) / MiB,
        "records_held": n,
    }


def _time_baseline_scan(path: str) -> float:
    with timer() as elapsed:
        _line_offsets(path)
        return elapsed()


def _bench_index(path: str, n: int) -> dict[str, Any]:
    from trainkit.data.records.metafile import build_line_index

    size_mb = os.path.getsize(path) / 1e6
    index_path = path + ".idx"
    if os.path.exists(index_path):
        os.unlink(index_path)
    os.system(f"cat {path} > /dev/null")  # warm the page cache: measure the scan, not the disk
    with timer() as elapsed:
        build_line_index(path, index_path, progress=False)
        build_s = elapsed()
    baseline_s = run_forked(_time_baseline_scan, path)
    rate = size_mb / build_s
    result = {
        "index_build_s": build_s,
        "index_mb_per_s": rate,
        "baseline_build_s": baseline_s,
        "baseline_mb_per_s": size_mb / baseline_s,
        "verdict": verdict(rate, _INDEX_TARGET_MB_S, higher_is_better=True),
    }
    print_table(
        f"Line index build, {n:.0e} records ({size_mb:.0f} MB, page cache warm)",
        ["index", "seconds", "MB/s", "target", "PASS/MISS"],
        [
            [
                "trainkit build_line_index (written, fsynced)",
                build_s,
                rate,
                target_text(_INDEX_TARGET_MB_S, higher_is_better=True),
                result["verdict"],
            ],
            ["baseline: Python list of line offsets", baseline_s, size_mb / baseline_s, "", ""],
        ],
    )
    return result


def bench_metafile(args: argparse.Namespace) -> dict[str, Any]:
    """Indexed metadata file (1e7 records): index build, private memory, random reads."""
    n, reads = int(args.meta_records), int(args.reads)
    work = args.workdir or tempfile.gettempdir()
    path = os.path.join(work, f"trainkit_bench_meta_{n}.jsonl")
    if not os.path.exists(path):
        print(f"writing {n:.0e} records to {path} (cached for later runs)")
        _write_meta_file(path, n)
    results: dict[str, Any] = {"records": n, "file_mib": os.path.getsize(path) / MiB}
    results.update(_bench_index(path, n))
    results["rows"], rows = [], []
    for kind in (
        "MetaFileDataset",
        "RankDataset (world 2, mini_epochs=1)",
        "RankDataset (world 2, mini_epochs=4)",
        _BASELINE,
    ):
        per_proc = [run_forked(_random_reads, kind, path, reads, seed) for seed in range(2)]
        worst = {
            "anon_growth": max(r["anon_growth"] for r in per_proc),
            "uss_growth": max(r["uss_growth"] for r in per_proc),
            "rate": min(r["rate"] for r in per_proc),
            "open_s": max(r["open_s"] for r in per_proc),
        }
        judged = kind == "MetaFileDataset"
        checks = [
            (worst["anon_growth"], _ANON_TARGET_MIB, False),
            (worst["rate"] / 1e3, _READS_TARGET_K_S, True),
        ]
        v = all_met(checks) if judged else ""
        results["rows"] += [{"kind": kind, **r, "verdict": v or None} for r in per_proc]
        target = f"<= {_ANON_TARGET_MIB:g} MiB; >= {_READS_TARGET_K_S:g} k/s" if judged else ""
        rows.append(
            [
                kind,
                f"{per_proc[0]['records_held']:,}",
                worst["anon_growth"],
                worst["uss_growth"],
                worst["rate"] / 1e3,
                worst["open_s"],
                target,
                v,
            ]
        )
    print_table(
        f"Random record reads, {n:.0e}-record file, 2 processes x {reads:,} reads "
        "(worst process shown)",
        [
            "dataset",
            "records in memory",
            "private anon growth MiB",
            "USS growth MiB",
            "k records/s",
            "open/load s",
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    return results
