"""Benchmarks of trainkit, each printed as a table next to the baseline it replaces.

Usage::

    python tools/benchmark.py --task TASK [TASK ...] [--json OUT] [--quick]

    TASK: sampler, data_memory, metafile, train, data, launch, checkpoint, eval or all

A task is a function in ``TASKS`` that takes the parsed arguments and returns a dict of
results (printed as Markdown tables while it runs, written to ``--json`` at the end). To add
a task, write ``def bench_<name>(args) -> dict`` and register it in ``TASKS``. Memory is
PSS/USS summed over every process of the measured job (see ``tools/_bench_utils.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for _bench_utils, bench/

from _bench_utils import (  # noqa: E402
    MiB,
    TreeSampler,
    print_table,
    run_forked,
    self_memory,
    timer,
    tree_memory,
    write_json,
)
from bench.checkpoint import bench_checkpoint  # noqa: E402
from bench.data import bench_data  # noqa: E402
from bench.launch import bench_launch  # noqa: E402
from bench.train import bench_eval, bench_train  # noqa: E402

# --------------------------------------------------------------------------- sampler

_SAMPLER_DRAWS = 5_000_000


def _sampler_case(kind: str, size: int, draws: int) -> dict[str, float]:
    """Runs in a fresh forked process: memory growth, first-index latency, indices/s."""
    import torch
    from torch.utils.data import DistributedSampler, RandomSampler

    from trainkit.data import TrainingSampler

    before = self_memory()
    with timer() as elapsed:
        if kind == "trainkit TrainingSampler":
            it = iter(TrainingSampler(size, seed=0, rank=0, world_size=1))
        elif kind == "trainkit worker share (1 of 2)":
            sampler = TrainingSampler(size, seed=0, rank=0, world_size=1)
            it = sampler.iter_worker_share(0, 2)
        elif kind == "torch RandomSampler":
            it = iter(RandomSampler(range(size), generator=torch.Generator().manual_seed(0)))
        elif kind == "torch DistributedSampler":
            it = iter(DistributedSampler(range(size), num_replicas=1, rank=0, seed=0))
        elif kind == "materialised numpy permutation":
            perm = np.random.default_rng(0).permutation(size)
            it = itertools.chain.from_iterable(
                perm[i : i + 65536].tolist() for i in range(0, size, 65536)
            )
        else:
            raise ValueError(kind)
        next(it)
        first_s = elapsed()
    draws = min(draws, size - 1)  # the torch samplers are finite: stay within one epoch
    with timer() as elapsed:
        for _ in itertools.islice(it, draws):
            pass
        rate = draws / elapsed()
    after = self_memory()
    return {
        "first_s": first_s,
        "rate": rate,
        "uss_growth": (after["uss"] - before["uss"]) / MiB,
        "peak_growth": (after["hwm"] - before["rss"]) / MiB,
    }


class _IdDataset:
    """A dataset of ``size`` tiny records computed from the index (no storage at all)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict[str, int]:
        return {"id": int(idx)}


def _loader_case(kind: str, size: int, batches: int) -> dict[str, float]:
    """Runs in a fresh forked process: the whole train loader, memory over its process tree."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from trainkit.data import TrainingSampler, build_batch_data_loader

    dataset = _IdDataset(size)
    me = os.getpid()
    before = tree_memory(me)
    with timer() as elapsed:
        if kind == "trainkit TrainLoader + TrainingSampler":
            loader = build_batch_data_loader(
                dataset,
                TrainingSampler(size, seed=0, rank=0, world_size=1),
                None,
                single_gpu_batch_size=8,
                num_workers=2,
            )
        else:
            loader = DataLoader(
                dataset,
                batch_size=8,
                sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=0),
                num_workers=2,
                collate_fn=list,
                multiprocessing_context="fork",
                generator=torch.Generator().manual_seed(0),
            )
        it = iter(loader)
        next(it)
        first_s = elapsed()
    for _ in itertools.islice(it, batches):
        pass
    after = tree_memory(me)
    del it
    return {
        "first_s": first_s,
        "pss_added": (after["pss"] - before["pss"]) / MiB,
        "uss_added": (after["uss"] - before["uss"]) / MiB,
        "procs": after["procs"],
    }


def bench_sampler(args: argparse.Namespace) -> dict[str, Any]:
    """Training sampler at 4e8 and the whole train loader at 1e7, against torch's."""
    size, base_size = int(args.sampler_size), int(args.baseline_size)
    cases = [
        ("trainkit TrainingSampler", size),
        ("trainkit worker share (1 of 2)", size),
        ("trainkit TrainingSampler", base_size),
        ("materialised numpy permutation", base_size),
        ("torch RandomSampler", base_size),
        ("torch DistributedSampler", base_size),
    ]
    rows, results = [], {"sampler": [], "loader": []}
    for kind, n in cases:
        r = run_forked(_sampler_case, kind, n, _SAMPLER_DRAWS)
        results["sampler"].append({"kind": kind, "size": n, **r})
        rows.append(
            [
                kind,
                f"{n:.0e}",
                r["uss_growth"],
                r["peak_growth"],
                r["first_s"] * 1e3,
                r["rate"] / 1e6,
            ]
        )
    rows.append(["**target** (trainkit at 4e8)", "4e+08", "<= 50", "<= 50", "<= 50", ">= 2"])
    print_table(
        f"Training sampler (one process; {_SAMPLER_DRAWS:.0e} indices drawn)",
        [
            "sampler",
            "size",
            "USS growth MiB",
            "peak RSS growth MiB",
            "first index ms",
            "M indices/s",
        ],
        rows,
    )
    loader_size = int(args.loader_size)
    rows = []
    for kind in ("trainkit TrainLoader + TrainingSampler", "torch DataLoader + DistributedSampler"):
        r = run_forked(_loader_case, kind, loader_size, 200)
        results["loader"].append({"kind": kind, "size": loader_size, **r})
        rows.append([kind, r["pss_added"], r["first_s"]])
    rows.append(["**target**", "<= 50", "<= 0.3"])
    print_table(
        f"Train loader, {loader_size:.0e} records, 2 fork workers, batch 8 (200 batches; "
        "memory summed over the main process and its workers)",
        ["loader", "PSS added MiB", "first batch s"],
        rows,
    )
    return results


# --------------------------------------------------------------------------- data_memory


def _make_records(n: int) -> Any:
    # A generator: what a catalog function that parses an annotation file would yield.
    for i in range(n):
        yield {
            "file_name": f"images/{i:08d}.jpg",
            "image_id": i,
            "height": 480,
            "width": 640 if i % 3 else 360,
            "category_id": i % 80,
        }


class _PrivateSerialized:
    """The pre-issue DatasetFromList: a private numpy buffer per rank (the baseline)."""

    def __init__(self, records: Any) -> None:
        blobs = [np.frombuffer(pickle.dumps(r, protocol=5), dtype=np.uint8) for r in records]
        self._ends = np.cumsum(np.asarray([b.size for b in blobs], dtype=np.int64))
        self._buffer = np.concatenate(blobs)

    def __len__(self) -> int:
        return int(self._ends.size)

    def __getitem__(self, idx: int) -> Any:
        start = int(self._ends[idx - 1]) if idx > 0 else 0
        return pickle.loads(memoryview(self._buffer[start : int(self._ends[idx])]))


class _TouchAll:
    """Item ``i`` makes the loader worker read the whole dataset (worst case: every page)."""

    def __init__(self, dataset: Any, num_items: int) -> None:
        self.dataset = dataset
        self.num_items = num_items

    def __len__(self) -> int:
        return self.num_items

    def __getitem__(self, i: int) -> int:
        ds = self.dataset
        if isinstance(ds, list):
            total = sum(r["image_id"] for r in ds)  # touches (and refcounts) every record
        else:
            buf, ends = _buffers(ds)
            total = int(buf[::4096].sum()) + int(ends[::512].sum())
            rng = random.Random(i)
            for _ in range(1000):
                total += ds[rng.randrange(len(ds))]["image_id"]
        return total


def _buffers(dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    # DatasetFromList keeps its records in a serialised list; the baseline holds them itself.
    held = getattr(dataset, "_lst", dataset)
    return held._buffer, held._ends


def _serialised_bytes(dataset: Any) -> int:
    buffer, ends = _buffers(dataset)
    return int(buffer.nbytes + ends.nbytes)


def _phase(out_dir: str, name: str) -> None:
    from trainkit.utils import comm

    with open(os.path.join(out_dir, "phases.jsonl"), "a") as f:
        f.write(json.dumps({"rank": comm.get_rank(), "phase": name, "t": time.monotonic()}) + "\n")


def _touch_and_hold(dataset: Any, start_method: str, out_dir: str, phase: str) -> None:
    """Let 2 loader workers read all of ``dataset``; hold them while the driver samples."""
    from torch.utils.data import DataLoader

    from trainkit.utils import comm

    loader = DataLoader(
        _TouchAll(dataset, 2), batch_size=1, num_workers=2, multiprocessing_context=start_method
    )
    it = iter(loader)
    list(itertools.islice(it, 2))
    comm.synchronize()
    _phase(out_dir, phase)
    time.sleep(1.5)  # the driver samples the steady state now, workers alive
    comm.synchronize()
    it._shutdown_workers()
    del it


def _data_memory_rank(mode: str, num_records: int, start_method: str, out_dir: str) -> dict:
    """One rank of the data_memory job: a control, then the dataset, each read by 2 workers.

    The control (the shared path with 10 records) runs in the same processes first, so the
    difference between the two steady states is what the records cost, free of the
    job-to-job noise of a separate control job.
    """
    from trainkit.data import DatasetFromList
    from trainkit.utils import comm

    comm.synchronize()
    control = DatasetFromList.from_local_leader(lambda: _make_records(10), copy=False)
    _touch_and_hold(control, start_method, out_dir, "control_touched")
    del control
    comm.synchronize()
    time.sleep(0.5)  # the control's workers are gone: the driver samples the baseline now
    _phase(out_dir, "build_start")
    if mode == "plain list":
        dataset: Any = list(_make_records(num_records))
    elif mode == "private serialised copy per rank":
        dataset = _PrivateSerialized(_make_records(num_records))
    elif mode == "shared, every rank builds":  # detectron2 style: DatasetFromList(list)
        records = list(_make_records(num_records))
        dataset = DatasetFromList(records, copy=False)
        del records
    else:  # the catalog path: local rank 0 loads, the other ranks attach
        dataset = DatasetFromList.from_local_leader(lambda: _make_records(num_records), copy=False)
    _phase(out_dir, "build_end")
    comm.synchronize()
    nbytes = 0 if isinstance(dataset, list) else _serialised_bytes(dataset)
    _touch_and_hold(dataset, start_method, out_dir, "touched")
    return {"serialised_bytes": nbytes}


def _data_memory_job(mode: str, num_records: int, start_method: str, out_dir: str) -> Any:
    from trainkit.engine import launch

    return launch(
        _data_memory_rank, 2, dist_url="auto", args=(mode, num_records, start_method, out_dir)
    )


def _measure_job(mode: str, num_records: int, start_method: str) -> dict[str, float]:
    import multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.get_context("fork")
        proc = ctx.Process(target=_data_memory_job, args=(mode, num_records, start_method, out_dir))
        proc.start()
        with TreeSampler(proc.pid, 0.05, count_memfd=True) as sampler:
            proc.join()
        if proc.exitcode:
            raise RuntimeError(f"data_memory job {mode}/{start_method} failed")
        phases: dict[str, list[float]] = {}
        with open(os.path.join(out_dir, "phases.jsonl")) as f:
            for line in f:
                p = json.loads(line)
                phases.setdefault(p["phase"], []).append(p["t"])
    build_start, build_end = min(phases["build_start"]), max(phases["build_end"])
    before = sampler.last_before(build_start)  # taken after the control's workers exited
    during = sampler.between(build_start, build_end) or [sampler.last_before(build_end)]
    result = {
        "build_peak_pss": (max(m["pss"] for m in during) - before["pss"]) / MiB,
        "build_s": build_end - build_start,
    }
    for prefix, phase in (("control_", "control_touched"), ("", "touched")):
        touched = max(phases[phase])
        steady = sampler.between(touched + 0.3, touched + 1.4)
        for key in ("pss", "uss", "memfd"):
            median = float(np.median([m[key] for m in steady]))
            result[f"{prefix}steady_{key}"] = median / MiB
        result[f"{prefix}procs"] = max(m["procs"] for m in steady)
    return result


def bench_data_memory(args: argparse.Namespace) -> dict[str, Any]:
    """Records of 2 local ranks x 2 loader workers: plain list, private copy, shared copy."""
    from trainkit.data import DatasetFromList

    n = int(args.records)
    one_copy = DatasetFromList(_make_records(n))
    copy_mib = _serialised_bytes(one_copy) / MiB
    del one_copy
    results: dict[str, Any] = {"records": n, "one_serialised_copy_mib": copy_mib, "rows": []}
    modes = [
        "plain list",
        "private serialised copy per rank",
        "shared (trainkit)",
        "shared, every rank builds",
    ]
    rows = []
    for start_method in ("fork", "spawn"):
        for mode in modes:
            r = _measure_job(mode, n, start_method)
            attributable = r["steady_pss"] - r["control_steady_pss"]
            row = {
                "mode": mode,
                "start": start_method,
                **r,
                "attributable_pss": attributable,
                "attributable_uss": r["steady_uss"] - r["control_steady_uss"],
            }
            results["rows"].append(row)
            memfd_copies = (r["steady_memfd"] - r["control_steady_memfd"]) / copy_mib
            rows.append(
                [
                    mode,
                    start_method,
                    attributable,
                    row["attributable_uss"],
                    r["build_peak_pss"],
                    attributable / copy_mib,
                    memfd_copies,
                    r["build_peak_pss"] / copy_mib,
                    r["build_s"],
                ]
            )
    rows.append(["**target** (shared)", "both", "", "", "", "<= 1.25", "<= 1.25", "<= 1.25", ""])
    print_table(
        f"Metadata memory, {n:.0e} records, 2 local ranks x 2 workers (every worker reads "
        f"every page); one serialised copy = {copy_mib:.1f} MiB; PSS summed over the job "
        "(memfd segments at full size), minus the same processes holding 10 records first",
        [
            "records held as",
            "workers",
            "PSS MiB",
            "USS MiB",
            "build peak PSS MiB",
            "PSS / copy",
            "memfd copies held",
            "build peak / copy",
            "build s",
        ],
        rows,
    )
    return results


# --------------------------------------------------------------------------- metafile


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


def _random_reads(kind: str, path: str, reads: int, seed: int) -> dict[str, float]:
    """Runs in a fresh forked process: open, then read ``reads`` random records."""
    from trainkit.data import MetaFileDataset, RankDataset

    before = self_memory()
    with timer() as elapsed:
        if kind == "MetaFileDataset":
            ds: Any = MetaFileDataset(path)
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


def bench_metafile(args: argparse.Namespace) -> dict[str, Any]:
    """Indexed metadata file (10M records): index build, private memory, random reads."""
    from trainkit.data.metafile import build_line_index

    n = int(args.meta_records)
    work = args.workdir or tempfile.gettempdir()
    path = os.path.join(work, f"trainkit_bench_meta_{n}.jsonl")
    if not os.path.exists(path):
        print(f"writing {n:.0e} records to {path} (cached for later runs)")
        _write_meta_file(path, n)
    size_mib = os.path.getsize(path) / MiB
    index_path = path + ".idx"
    if os.path.exists(index_path):
        os.unlink(index_path)
    os.system(f"cat {path} > /dev/null")  # warm the page cache: measure the scan, not the disk
    with timer() as elapsed:
        build_line_index(path, index_path, progress=False)
        build_s = elapsed()
    results: dict[str, Any] = {
        "records": n,
        "file_mib": size_mib,
        "index_build_s": build_s,
        "index_mb_per_s": os.path.getsize(path) / 1e6 / build_s,
        "rows": [],
    }
    print_table(
        f"Line index build, {n:.0e} records ({size_mib:.0f} MiB, page cache warm)",
        ["seconds", "MB/s", "target MB/s"],
        [[build_s, results["index_mb_per_s"], ">= 200"]],
    )
    rows = []
    for kind in (
        "MetaFileDataset",
        "RankDataset (world 2, mini_epochs=1)",
        "RankDataset (world 2, mini_epochs=4)",
    ):
        per_proc = [
            run_forked(_random_reads, kind, path, int(args.reads), seed) for seed in range(2)
        ]
        for r in per_proc:
            results["rows"].append({"kind": kind, **r})
        rows.append(
            [
                kind,
                f"{per_proc[0]['records_held']:,}",
                max(r["anon_growth"] for r in per_proc),
                max(r["uss_growth"] for r in per_proc),
                min(r["rate"] for r in per_proc) / 1e3,
                max(r["open_s"] for r in per_proc),
            ]
        )
    rows.append(["**target** (MetaFileDataset)", "", "<= 64", "", ">= 50", ""])
    print_table(
        f"Random record reads, {n:.0e}-record file, 2 processes x {int(args.reads):,} reads "
        "(worst process shown)",
        [
            "dataset",
            "records in memory",
            "private anon growth MiB",
            "USS growth MiB",
            "k records/s",
            "open/load s",
        ],
        rows,
    )
    return results


TASKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "sampler": bench_sampler,
    "data_memory": bench_data_memory,
    "metafile": bench_metafile,
    "train": bench_train,
    "data": bench_data,
    "launch": bench_launch,
    "checkpoint": bench_checkpoint,
    "eval": bench_eval,
}


def main() -> None:
    """Parse the arguments and run the requested tasks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        required=True,
        nargs="+",
        choices=[*sorted(TASKS), "all"],
        help="tasks to run; 'all' runs every task in TASKS' order",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and one round (checks that a task runs, not timing)",
    )
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--sampler-size", type=float, default=4e8)
    parser.add_argument(
        "--baseline-size",
        type=float,
        default=4e7,
        help="size for the materialising baselines (4e8 needs > 14 GB for torch)",
    )
    parser.add_argument("--loader-size", type=float, default=1e7)
    parser.add_argument("--records", type=float, default=1e6, help="data_memory records")
    parser.add_argument("--meta-records", type=float, default=1e7, help="metafile records")
    parser.add_argument("--reads", type=float, default=200_000, help="random reads per process")
    parser.add_argument("--workdir", help="where the metafile task keeps its file")
    args = parser.parse_args()
    tasks = list(TASKS) if "all" in args.task else args.task
    results = {}
    for task in tasks:
        with timer() as elapsed:
            results[task] = TASKS[task](args)
        print(f"\n({task}: {elapsed():.0f} s)")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
