"""``sampler``: the training sampler and the whole train loader at scale, against torch's.

The sampler at 4e8 records (memory growth, first index, indices/s) beside torch's
``RandomSampler`` / ``DistributedSampler`` and a materialised numpy permutation at 4e7 (they
hold the permutation: 4e8 needs over 14 GB); then the whole train loader over 1e7 records
(memory over the main process and its workers, first batch) beside a torch ``DataLoader`` +
``DistributedSampler`` on the same records.
"""

from __future__ import annotations

import argparse
import itertools
import os
from typing import Any

import numpy as np

from benchmarks.measure import MiB, run_forked, self_memory, timer, tree_memory
from benchmarks.report import all_met, print_table

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
    """Runs in a fresh process: the whole train loader, memory over its process tree."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from trainkit.data import TrainingSampler, build_batch_data_loader

    # What any first loader of a process pays (modules torch imports on the first iteration
    # with workers) is paid here, outside the measurement.
    list(DataLoader(range(2), num_workers=2, multiprocessing_context="fork"))
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
        "data_pss_added": (after["pss_data"] - before["pss_data"]) / MiB,
        "uss_added": (after["uss"] - before["uss"]) / MiB,
        "procs": after["procs"],
    }


# trainkit at full size (4e8): memory growth and first index in MiB / ms, indices per second.
_SAMPLER_TARGETS = {"uss_growth": 50.0, "peak_growth": 50.0, "first_ms": 50.0, "rate_m": 2.0}
_LOADER_TARGETS = {"data_pss_added": 50.0, "first_s": 0.3}


def _sampler_verdict(r: dict[str, float]) -> str:
    t = _SAMPLER_TARGETS
    return all_met(
        [
            (r["uss_growth"], t["uss_growth"], False),
            (r["peak_growth"], t["peak_growth"], False),
            (r["first_s"] * 1e3, t["first_ms"], False),
            (r["rate"] / 1e6, t["rate_m"], True),
        ]
    )


def bench_sampler(args: argparse.Namespace) -> dict[str, Any]:
    """Training sampler at 4e8 and the whole train loader at 1e7, against torch's."""
    size, base_size = int(args.sampler_size), int(args.baseline_size)
    draws = min(_SAMPLER_DRAWS, 50_000) if args.quick else _SAMPLER_DRAWS
    cases = [
        ("trainkit TrainingSampler", size),
        ("trainkit worker share (1 of 2)", size),
        ("trainkit TrainingSampler", base_size),
        ("materialised numpy permutation", base_size),
        ("torch RandomSampler", base_size),
        ("torch DistributedSampler", base_size),
    ]
    t = _SAMPLER_TARGETS
    sampler_target = (
        f"USS, peak <= {t['uss_growth']:g}; first <= {t['first_ms']:g} ms; >= {t['rate_m']:g} M/s"
    )
    rows, results = [], {"sampler": [], "loader": []}
    for kind, n in cases:
        r = run_forked(_sampler_case, kind, n, draws)
        judged = kind.startswith("trainkit") and n == size
        v = _sampler_verdict(r) if judged else ""
        results["sampler"].append({"kind": kind, "size": n, **r, "verdict": v or None})
        rows.append(
            [
                kind,
                f"{n:.0e}",
                r["uss_growth"],
                r["peak_growth"],
                r["first_s"] * 1e3,
                r["rate"] / 1e6,
                sampler_target if judged else "",
                v,
            ]
        )
    print_table(
        f"Training sampler (one process; {draws:.0e} indices drawn; the baselines hold the "
        f"permutation, so they run at {base_size:.0e})",
        [
            "sampler",
            "size",
            "USS growth MiB",
            "peak RSS growth MiB",
            "first index ms",
            "M indices/s",
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    results["loader"] = _bench_loader(int(args.loader_size))
    return results


def _bench_loader(loader_size: int) -> list[dict[str, Any]]:
    t = _LOADER_TARGETS
    rows, results = [], []
    for kind in ("trainkit TrainLoader + TrainingSampler", "torch DataLoader + DistributedSampler"):
        # A spawned case: a forked one would share its heap with this process, and its
        # workers would then move part of this process's pages into the measured tree.
        r = run_forked(_loader_case, kind, loader_size, 200, start_method="spawn")
        judged = kind.startswith("trainkit")
        checks = [
            (r["data_pss_added"], t["data_pss_added"], False),
            (r["first_s"], t["first_s"], False),
        ]
        v = all_met(checks) if judged else ""
        results.append({"kind": kind, "size": loader_size, **r, "verdict": v or None})
        target = f"<= {t['data_pss_added']:g} MiB; <= {t['first_s']:g} s" if judged else ""
        rows.append([kind, r["data_pss_added"], r["pss_added"], r["first_s"], target, v])
    print_table(
        f"Train loader, {loader_size:.0e} records, 2 fork workers, batch 8 (200 batches; "
        "memory summed over the main process and its workers: PSS of anonymous and "
        "shared-memory pages, and PSS of all pages, which adds the file pages the workers map)",
        ["loader", "memory added MiB", "PSS added MiB", "first batch s", "target", "PASS/MISS"],
        rows,
    )
    return results
