"""The job the goodput benchmark starts and kills: ``tools/train_net.py`` plus a progress hook.

    TRAINKIT_BENCH_PROGRESS_DIR=/tmp/progress python benchmarks/goodput_job.py \
        --config-file configs/smoke.yaml --num-gpus 2 --max-restarts 25 OUTPUT_DIR /tmp/out

Every process overwrites ``<progress dir>/rank<R>`` after each step with its iteration, the
time and its pid (a fixed-width record at offset 0: one ``pwrite``, a few microseconds), so
the benchmark knows how far the job is and which pid to kill; and appends one line to
``<progress dir>/starts.jsonl`` at its first step, so each restart's first step and time are
known without polling for them. The uninterrupted runs carry the same hook.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import train_net  # noqa: E402

from trainkit.engine import HookBase, default_argument_parser, launch  # noqa: E402
from trainkit.utils import comm  # noqa: E402

PROGRESS_ENV = "TRAINKIT_BENCH_PROGRESS_DIR"
RECORD_BYTES = 64


class ProgressHook(HookBase):
    """Publish this process's last finished iteration for the benchmark driver."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._fd = -1

    def after_step(self) -> None:
        iteration = self.trainer.iter
        now = time.time()
        if self._fd < 0:
            rank = comm.get_rank()
            path = os.path.join(self._directory, f"rank{rank}")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            start = {"rank": rank, "pid": os.getpid(), "iter": iteration, "time": now}
            with open(os.path.join(self._directory, "starts.jsonl"), "a") as f:
                f.write(json.dumps(start) + "\n")
        record = f"{iteration} {now:.6f} {os.getpid()}".ljust(RECORD_BYTES - 1) + "\n"
        os.pwrite(self._fd, record.encode(), 0)

    def after_train(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)


class Trainer(train_net.Trainer):
    """The main job's trainer with :class:`ProgressHook` last."""

    def build_hooks(self):
        return [*super().build_hooks(), ProgressHook(os.environ[PROGRESS_ENV])]


def main(args):
    cfg = train_net.setup(args)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
        max_restarts=args.max_restarts,
    )
