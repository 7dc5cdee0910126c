"""The task registry and the command line of ``python tools/benchmark.py`` / ``-m benchmarks``.

A task is a function that takes the parsed arguments and returns a dict of results; it
prints its tables (trainkit beside its baseline, a target and a PASS/MISS column) while it
runs, and the runner writes every task's dict to ``--json`` at the end. To add a task, write
``bench_<name>(args) -> dict`` in ``benchmarks/<name>.py`` and register it in :data:`TASKS`.

``--write-docs`` also writes each task's tables, with the command, the date and the machine,
into :data:`PERFORMANCE_PAGE` as soon as the task has run (see :mod:`benchmarks.report`). It
needs full-size figures, so it is refused with ``--quick``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.checkpoint import bench_checkpoint
from benchmarks.compile import bench_compile
from benchmarks.data import bench_data
from benchmarks.data_memory import bench_data_memory
from benchmarks.device import bench_device
from benchmarks.eval import bench_eval
from benchmarks.fsdp import bench_fsdp
from benchmarks.goodput import bench_goodput
from benchmarks.import_cost import bench_import_cost
from benchmarks.launch import bench_launch
from benchmarks.mapper import bench_mapper
from benchmarks.measure import timer
from benchmarks.metafile import bench_metafile
from benchmarks.report import (
    machine_summary,
    task_section,
    tee_stdout,
    update_performance_page,
    write_json,
)
from benchmarks.sampler import bench_sampler
from benchmarks.train import bench_train
from trainkit.utils.collect_env import collect_env_info

TASKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "sampler": bench_sampler,
    "data_memory": bench_data_memory,
    "metafile": bench_metafile,
    "train": bench_train,
    "data": bench_data,
    "mapper": bench_mapper,
    "launch": bench_launch,
    "checkpoint": bench_checkpoint,
    "eval": bench_eval,
    "goodput": bench_goodput,
    "import_cost": bench_import_cost,
    "device": bench_device,
    "compile": bench_compile,
    "fsdp": bench_fsdp,
}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The page --write-docs writes (tests point it elsewhere).
PERFORMANCE_PAGE = os.path.join(ROOT, "docs", "performance.md")

# Sizes of the data-at-scale tasks: (full run, --quick). --quick checks that a task runs,
# not how fast: its sizes are small enough for a test.
_SIZES = {
    "sampler_size": (4e8, 1e6),
    "baseline_size": (4e7, 1e5),
    "loader_size": (1e7, 1e5),
    "records": (1e6, 2e4),
    "meta_records": (1e7, 2e4),
    "reads": (200_000, 2_000),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; sizes left out take their full or ``--quick`` defaults."""
    parser = argparse.ArgumentParser(
        description="Benchmarks of trainkit, each printed as a table beside its baseline."
    )
    parser.add_argument(
        "--task",
        required=True,
        nargs="+",
        choices=[*TASKS, "all"],
        help="tasks to run; 'all' runs every task in this order",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and one round (checks that a task runs, not timing)",
    )
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="write each task's tables, the command, date and machine into docs/performance.md "
        "(full-size runs only: not with --quick)",
    )
    parser.add_argument("--sampler-size", type=float, help="sampler task: trainkit size (4e8)")
    parser.add_argument(
        "--baseline-size",
        type=float,
        help="sampler task: size for the materialising baselines (4e7; 4e8 needs > 14 GB)",
    )
    parser.add_argument("--loader-size", type=float, help="sampler task: loader records (1e7)")
    parser.add_argument("--records", type=float, help="data_memory records (1e6)")
    parser.add_argument("--meta-records", type=float, help="metafile records (1e7)")
    parser.add_argument("--reads", type=float, help="metafile random reads per process (2e5)")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="device task: where the trainer and the hand loop run (cuda needs a GPU)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="device task: alternating runs of the trainer and the hand loop per case (3); "
        "more settle a ratio on a noisy machine",
    )
    parser.add_argument(
        "--eager-only",
        action="store_true",
        help="device task: leave out the compiled cases (their warm-up takes minutes)",
    )
    parser.add_argument(
        "--compile-batches",
        type=int,
        help="compile task: training batches of the main job (120; fewer cover fewer shapes)",
    )
    parser.add_argument("--workdir", help="where the metafile and checkpoint tasks write")
    parser.add_argument(
        "--d2-root",
        help="mapper task: a detectron2 source checkout whose DatasetMapper is the baseline "
        "(default: the same work in plain PIL/numpy)",
    )
    args = parser.parse_args(argv)
    if args.quick and args.write_docs:
        # One line, no usage text: the page holds full-size figures only.
        print(
            f"{parser.prog}: --write-docs writes full-size figures into docs/performance.md; "
            "leave out --quick (its tiny sizes are for tests)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    for name, (full, quick) in _SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the tasks named on the command line; return their results by task."""
    args = parse_args(argv)
    tasks = list(TASKS) if "all" in args.task else list(dict.fromkeys(args.task))
    command = _command(argv)
    results = {}
    for task in tasks:
        with timer() as elapsed, tee_stdout() as printed:
            results[task] = TASKS[task](args)
        seconds = elapsed()
        print(f"\n({task}: {seconds:.0f} s)")
        if args.write_docs:  # after each task: a later task that fails keeps what ran
            _write_docs(task, printed.getvalue(), command, seconds)
    if args.json:
        write_json(args.json, results)
    return results


def _command(argv: Sequence[str] | None) -> str:
    """The command line as a reader would type it from the repository root."""
    if argv is not None:
        return shlex.join(["python", "tools/benchmark.py", *argv])
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    program = (
        ["-m", "benchmarks"] if script == os.path.join("benchmarks", "__main__.py") else [script]
    )
    return shlex.join(["python", *program, *sys.argv[1:]])


def _write_docs(task: str, printed: str, command: str, seconds: float) -> None:
    section = task_section(
        task,
        printed,
        command=command,
        date=datetime.date.today().isoformat(),
        seconds=seconds,
        machine=machine_summary(collect_env_info()),
    )
    update_performance_page(PERFORMANCE_PAGE, {task: section}, order=list(TASKS))
    print(f"({task}: tables written to {os.path.relpath(PERFORMANCE_PAGE, ROOT)})")
