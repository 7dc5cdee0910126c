"""``data_memory``: what the records cost when 2 local ranks x 2 loader workers read them.

Held as a plain list, as a private serialised copy per rank (the old ``DatasetFromList``),
and as trainkit's one shared copy per machine, found by content with no collective (the
catalog path, where every rank writes the records of a generator into its segment one by
one, and detectron2's style, where every rank calls ``DatasetFromList(list)``); with fork
and spawn workers. Memory is PSS summed over the job, minus the same processes holding 10
records. While the ranks build, the machine holds one copy per building rank (the
mechanism's cost): the build peak is reported for both shared rows, and judged for neither.

Private use: ``DatasetFromList._lst`` (its ``_buffer`` and ``_ends``), to size one
serialised copy and to make a worker touch its every page; no public name exposes the buffer.
And torch's ``_shutdown_workers()``, to stop the workers at a known moment between phases.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import random
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.measure import MiB, TreeSampler
from benchmarks.report import all_met, print_table

_TARGET_COPIES = 1.25  # the shared modes: at most this many serialised copies per machine


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
    else:  # the catalog path: every rank writes a generator's records, one copy is kept
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


def _row_verdict(mode: str, pss_copies: float, memfd_copies: float, peak_copies: float) -> str:
    if mode not in ("shared (trainkit)", "shared, every rank builds"):
        return ""
    # Ranks that build at the same moment each hold a copy while building (no collective
    # makes one rank wait for another): the steady state is judged.
    del peak_copies
    checks = [pss_copies, memfd_copies]
    return all_met([(c, _TARGET_COPIES, False) for c in checks])


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
    # --quick checks that the task runs: the fork jobs take the same code path as spawn.
    for start_method in ("fork",) if args.quick else ("fork", "spawn"):
        for mode in modes:
            r = _measure_job(mode, n, start_method)
            attributable = r["steady_pss"] - r["control_steady_pss"]
            pss_copies = attributable / copy_mib
            memfd_copies = (r["steady_memfd"] - r["control_steady_memfd"]) / copy_mib
            peak_copies = r["build_peak_pss"] / copy_mib
            v = _row_verdict(mode, pss_copies, memfd_copies, peak_copies)
            row = {
                "mode": mode,
                "start": start_method,
                **r,
                "attributable_pss": attributable,
                "attributable_uss": r["steady_uss"] - r["control_steady_uss"],
                "verdict": v or None,
            }
            results["rows"].append(row)
            target = ""
            if v:
                target = f"PSS, memfd <= {_TARGET_COPIES:g} copies"
            rows.append(
                [
                    mode,
                    start_method,
                    attributable,
                    row["attributable_uss"],
                    r["build_peak_pss"],
                    pss_copies,
                    memfd_copies,
                    peak_copies,
                    r["build_s"],
                    target,
                    v,
                ]
            )
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
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    return results
