"""``goodput``: what a job keeps of its time through 20 SIGKILLs, sync vs async checkpoints.

The main job (``benchmarks/goodput_job.py``: ``tools/train_net.py`` with a progress hook) runs
on 2 processes with Gloo, once uninterrupted and once with SIGKILLs of a random rank on a
seeded schedule of iterations, restarted each time by ``--max-restarts`` (the restarted job
resumes from its newest checkpoint by itself). Per checkpoint mode and period:

* goodput: wall time of the uninterrupted run / wall time of the run with failures;
* time to recover: from the SIGKILL until the job is back at the iteration it had reached
  (median and worst); the restart alone (SIGKILL to the first step of the new round) too;
* steps lost per failure: iterations the job had finished and trains again;
* whether the final weights are bit-identical to the uninterrupted run's.

Both runs of a row pay the same start-up and the same checkpoint writes; the schedule of
kills is the same in every row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from benchmarks.measure import median
from benchmarks.report import print_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "goodput_job.py")
CONFIG = os.path.join(ROOT, "configs", "smoke.yaml")
SEED = 0
RUN_TIMEOUT_S = 1800.0


def _command(output_dir: str, period: int, async_save: bool, max_iter: int, restarts: int):
    return [
        sys.executable,
        JOB,
        "--config-file",
        CONFIG,
        "--num-gpus",
        "2",
        "--max-restarts",
        str(restarts),
        "OUTPUT_DIR",
        output_dir,
        "SOLVER.MAX_ITER",
        str(max_iter),
        "SOLVER.CHECKPOINT_PERIOD",
        str(period),
        "SOLVER.CHECKPOINT_ASYNC",
        str(async_save),
        "SOLVER.REFERENCE_WORLD_SIZE",
        "0",
        "DATALOADER.NUM_WORKERS",
        "0",
        "TEST.EVAL_PERIOD",
        "0",
        "WRITER_PERIOD",
        "20",
    ]


def _progress(directory: str, rank: int) -> tuple[int, float, int] | None:
    """(iteration, time, pid) that rank ``rank`` last published, or None before its first step."""
    try:
        with open(os.path.join(directory, f"rank{rank}")) as f:
            fields = f.read().split()
    except FileNotFoundError:
        return None
    if len(fields) != 3:
        return None
    return int(fields[0]), float(fields[1]), int(fields[2])


def _wait(condition, proc: subprocess.Popen, log: str, what: str, timeout: float = 600.0):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended before {what}; its log: {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}; its log: {log}")
        time.sleep(0.002)


def _run(
    workdir: str, name: str, period: int, async_save: bool, max_iter: int, kills: list
) -> dict[str, Any]:
    """Run the job once, SIGKILLing rank ``r`` when it reaches iteration ``i`` for each kill."""
    output_dir, progress = os.path.join(workdir, name), os.path.join(workdir, name + ".progress")
    os.makedirs(progress)
    log = os.path.join(workdir, name + ".log")
    command = _command(output_dir, period, async_save, max_iter, restarts=len(kills) + 3)
    env = dict(os.environ, TRAINKIT_BENCH_PROGRESS_DIR=progress, GLOO_SOCKET_IFNAME="lo")
    failures, dead_pids = [], set()
    with open(log, "w") as log_file:
        start = time.time()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=log_file)
        try:
            for iteration, rank in kills:

                def live(rank=rank, iteration=iteration):
                    record = _progress(progress, rank)
                    ok = record and record[2] not in dead_pids and record[0] >= iteration
                    return record if ok else None

                _, _, pid = _wait(live, proc, log, f"iteration {iteration}")
                os.kill(pid, signal.SIGKILL)
                killed_at = time.time()
                records = [r for r in (_progress(progress, k) for k in (0, 1)) if r]
                reached = max(r[0] for r in records if r[2] not in dead_pids)
                dead_pids.update(r[2] for r in records)

                def recovered(reached=reached):
                    records = [_progress(progress, k) for k in (0, 1)]
                    back = [r for r in records if r and r[2] not in dead_pids and r[0] >= reached]
                    return back[0] if back else None

                _wait(recovered, proc, log, f"recovery to iteration {reached}")
                recovered_s = time.time() - killed_at
                failures.append(
                    {"reached": reached, "killed_at": killed_at, "recovered_s": recovered_s}
                )
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall = time.time() - start
    if code != 0:
        raise RuntimeError(f"the job exited with status {code}; its log: {log}")
    _add_restarts(failures, os.path.join(progress, "starts.jsonl"))
    final = os.path.join(output_dir, "model_final.pth")
    return {"wall_s": wall, "failures": failures, "final": final}


def _add_restarts(failures: list[dict[str, Any]], starts_file: str) -> None:
    """Add each failure's restart time and steps lost, from the first steps of the rounds."""
    with open(starts_file) as f:
        starts = sorted((json.loads(line) for line in f), key=lambda s: s["time"])
    for failure in failures:
        first = next(s for s in starts if s["time"] > failure["killed_at"])
        failure["restart_s"] = first["time"] - failure["killed_at"]
        # The round's first step is the one after the checkpoint it resumed from.
        failure["steps_lost"] = failure["reached"] - (first["iter"] - 1)


def _same_weights(a: str, b: str) -> bool:
    x = torch.load(a, map_location="cpu", weights_only=True)["model"]
    y = torch.load(b, map_location="cpu", weights_only=True)["model"]
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def bench_goodput(args: argparse.Namespace) -> dict[str, Any]:
    """Goodput, recovery time and steps lost over seeded SIGKILLs; sync and async checkpoints."""
    max_iter, num_kills, periods = (60, 2, (10,)) if args.quick else (1000, 20, (10, 50))
    rng = random.Random(SEED)
    kill_iters = sorted(rng.sample(range(20, max_iter - 20), num_kills))
    kills = [(iteration, rng.randrange(2)) for iteration in kill_iters]
    rows, results = [], {"kills": kills, "max_iter": max_iter, "rows": []}
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        reference = None
        for period in periods:
            for async_save in (False, True):
                mode = "async" if async_save else "sync"
                name = f"{mode}{period}"
                straight = _run(workdir, name + "_straight", period, async_save, max_iter, [])
                failed = _run(workdir, name + "_killed", period, async_save, max_iter, kills)
                reference = reference or straight["final"]
                failures = failed["failures"]
                recover = [f["recovered_s"] for f in failures]
                restart = [f["restart_s"] for f in failures]
                lost = [f["steps_lost"] for f in failures]
                equal = _same_weights(failed["final"], straight["final"])
                equal_across = _same_weights(failed["final"], reference)
                row = {
                    "checkpoints": mode,
                    "period": period,
                    "uninterrupted_s": straight["wall_s"],
                    "with_failures_s": failed["wall_s"],
                    "goodput": straight["wall_s"] / failed["wall_s"],
                    "recover_median_s": median(recover),
                    "recover_worst_s": max(recover),
                    "restart_median_s": median(restart),
                    "steps_lost_mean": sum(lost) / len(lost),
                    "steps_lost_max": max(lost),
                    "weights_equal": equal,
                    "weights_equal_across_rows": equal_across,
                    "failures": failures,
                }
                results["rows"].append(row)
                rows.append(
                    [
                        mode,
                        period,
                        row["uninterrupted_s"],
                        row["with_failures_s"],
                        row["goodput"],
                        row["recover_median_s"],
                        row["recover_worst_s"],
                        row["restart_median_s"],
                        f"{row['steps_lost_mean']:.1f} / {row['steps_lost_max']}",
                        "yes" if equal and equal_across else "NO",
                        "bit-identical",
                        "PASS" if equal and equal_across else "MISS",
                    ]
                )
    print_table(
        f"Goodput: tools/train_net.py, 2 processes (Gloo), {max_iter} iterations, "
        f"{num_kills} SIGKILLs of a random rank (seed {SEED}), --max-restarts; "
        "recovery = SIGKILL until back at the iteration reached",
        [
            "checkpoints",
            "period (iters)",
            "uninterrupted s",
            "with kills s",
            "goodput",
            "recover median s",
            "recover worst s",
            "restart median s",
            "steps lost mean / max",
            "final weights = uninterrupted",
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    return results
