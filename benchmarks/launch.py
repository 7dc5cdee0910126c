"""``launch``: start-up and failure surfacing of ``launch`` against ``mp.spawn``."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import tempfile
import time
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as tmp

from benchmarks.measure import alternate, median
from benchmarks.report import print_table, target_text, verdict
from trainkit.engine import LaunchError, launch
from trainkit.utils import comm

FAILURE_TARGET_S = 5.0


def _launched_main() -> int:
    return comm.get_rank()


def _spawned_main(local_rank: int, world_size: int, port: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=world_size
    )
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fail(how: str, stamp_file: str) -> None:
    """Rank 1 fails (raises, or SIGKILLs itself); rank 0 waits in a collective."""
    if dist.get_rank() == 1:
        time.sleep(0.2)  # let rank 0 enter the barrier
        with open(stamp_file, "w") as f:
            f.write(repr(time.time()))
        if how == "raise":
            raise RuntimeError("benchmark: rank 1 fails on purpose")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # rank 0 blocks here until the failure is noticed


def _launched_fail(how: str, stamp_file: str) -> None:
    _fail(how, stamp_file)


def _spawned_fail(local_rank: int, port: int, how: str, stamp_file: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=2
    )
    _fail(how, stamp_file)


def _time_failure(kind: str, how: str) -> float:
    """Seconds from rank 1's failure to the launcher raising."""
    with tempfile.TemporaryDirectory() as d:
        stamp = os.path.join(d, "failed_at")
        try:
            if kind == "trainkit":
                launch(_launched_fail, 2, args=(how, stamp))
            else:
                tmp.spawn(_spawned_fail, args=(_free_port(), how, stamp), nprocs=2)
        except (LaunchError, Exception):
            surfaced = time.time()
        else:
            raise RuntimeError(f"{kind}: the failing job returned normally")
        with open(stamp) as f:
            return surfaced - float(f.read())


def bench_launch(args: argparse.Namespace) -> dict[str, Any]:
    """Round trip of a 2-process Gloo job, and how fast a failed rank is reported."""
    rounds = 1 if args.quick else 3

    def trainkit_start() -> float:
        start = time.perf_counter()
        if launch(_launched_main, 2) != [0, 1]:
            raise RuntimeError("launch returned the wrong ranks")
        return time.perf_counter() - start

    def spawn_start() -> float:
        start = time.perf_counter()
        tmp.spawn(_spawned_main, args=(2, _free_port()), nprocs=2)
        return time.perf_counter() - start

    startup = alternate({"trainkit": trainkit_start, "spawn": spawn_start}, rounds)
    tk, base = median(startup["trainkit"]), median(startup["spawn"])
    ratio = tk / base
    results: dict[str, Any] = {
        "startup": {
            "samples": startup,
            "trainkit_s": tk,
            "spawn_s": base,
            "ratio": ratio,
            "target": 1.2,
            "verdict": verdict(ratio, 1.2, higher_is_better=False),
        }
    }
    print_table(
        f"Start-up: launch(main, 2) vs torch.multiprocessing.spawn + init_process_group(gloo, "
        f"tcp://127.0.0.1) + barrier, call to return; medians of {rounds} alternating runs",
        ["launch s", "mp.spawn s", "ratio", "target", "PASS/MISS"],
        [
            [
                tk,
                base,
                ratio,
                target_text(1.2, higher_is_better=False),
                results["startup"]["verdict"],
            ]
        ],
    )
    rows, results["failure"] = [], []
    for how, label in (("raise", "rank 1 raises"), ("kill", "rank 1 SIGKILLed")):
        seconds = {kind: _time_failure(kind, how) for kind in ("trainkit", "spawn")}
        v = verdict(seconds["trainkit"], FAILURE_TARGET_S, higher_is_better=False)
        results["failure"].append(
            {"case": label, **seconds, "target_s": FAILURE_TARGET_S, "verdict": v}
        )
        rows.append(
            [
                f"{label}, rank 0 in a barrier",
                seconds["trainkit"],
                seconds["spawn"],
                target_text(FAILURE_TARGET_S, higher_is_better=False),
                v,
            ]
        )
    print_table(
        "Failure surfaced: seconds from the failure to the launcher raising (one run each)",
        ["case", "launch s", "mp.spawn s", "target (launch)", "PASS/MISS"],
        rows,
    )
    return results
