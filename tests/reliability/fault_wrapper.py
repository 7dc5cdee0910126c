"""Run tools/train_net.py with one injected fault, chosen by $TRAINKIT_TEST_FAULT.

    TRAINKIT_TEST_FAULT=kill_during_save:model_0000019 python fault_wrapper.py --config-file ...

The patches are installed at import time, so they also apply inside the processes that
launch() spawns (they import this file as their main module). Faults:

* ``kill_during_save:NAME``: SIGKILL this process after writing half of checkpoint NAME.
* ``enospc_on_save:NAME``: fail the write of checkpoint NAME with "No space left on device".
* ``nan_at_iter:K``: the model returns a NaN loss at its K-th training step in this process.
* ``worker_dies:K``: the loader worker that maps its K-th sample is SIGKILLed.
* ``mapper_raises``: the mapper raises for every record whose image_id is a multiple of 7.
* ``raise_on_rank:R:K``: rank R raises at its K-th training step (``raise_on_rank:R:K:N``:
  only in restart round N of the job, e.g. 0 for the first run only).
* ``sleep_at_iter:K``: the K-th training step sleeps 60 s, after creating the file named by
  $TRAINKIT_TEST_MARKER (so a test knows the process is inside that step).
* ``stall_data_on_rank:R:K``: on rank R, mapping the K-th training record takes 120 s (a
  hung file system, as far as the job can tell).
* ``slow_data_on_rank:R:S``: on rank R, mapping every training record takes S seconds more
  (a slow disk on one machine: the straggler detector names that rank, phase ``data``).

Independently of the fault, ``TRAINKIT_TEST_LEDGER=DIR`` makes every process append one JSON
line per training forward to ``DIR/ledger.<pid>.jsonl``: the job's round (its store
namespace, which no other round shares; the pid for a job of one process), the rank, the
world size, the iteration and the ``image_id`` of each record in the micro-batch. A test
keeps, for each iteration, the lines of the last round that ran it (a round replays the
iterations after its checkpoint), and so sees which records every optimizer step used.
"""

import errno
import io
import os
import signal
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import train_net  # noqa: E402

FAULT = os.environ.get("TRAINKIT_TEST_FAULT", "")
KIND, _, ARG = FAULT.partition(":")


def _patch_save(action):
    # The checkpointer writes through a temporary file descriptor, so torch.save cannot see
    # the checkpoint's name: remember it from the method that writes the file (in the
    # training thread, or in the writer thread with SOLVER.CHECKPOINT_ASYNC).
    from trainkit.checkpoint import Checkpointer

    original = torch.save
    original_write = Checkpointer._write_checkpoint
    saving = [""]

    def write_checkpoint(self, save_file, *args, **kwargs):
        saving[0] = os.path.splitext(os.path.basename(save_file))[0]
        try:
            return original_write(self, save_file, *args, **kwargs)
        finally:
            saving[0] = ""

    def save(obj, f, *args, **kwargs):
        if saving[0] == ARG:
            buffer = io.BytesIO()
            original(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            action()
        return original(obj, f, *args, **kwargs)

    torch.save = save
    Checkpointer._write_checkpoint = write_checkpoint


def _patch_forward(make_result):
    from trainkit.modeling.image_classifier import ImageClassifier

    original = ImageClassifier.forward
    calls = [0]

    def forward(self, batched_inputs):
        out = original(self, batched_inputs)
        if self.training:
            calls[0] += 1
            return make_result(calls[0], out)
        return out

    ImageClassifier.forward = forward


def _keep_ledger(directory):
    import json
    import time

    from trainkit.modeling.image_classifier import ImageClassifier

    original = ImageClassifier.forward
    path = os.path.join(directory, f"ledger.{os.getpid()}.jsonl")

    def forward(self, batched_inputs):
        if self.training:
            from trainkit.utils import comm
            from trainkit.utils.events import get_event_storage

            line = {
                # The restart count would not do: a change of machines restarts without
                # counting, and a machine's first round counts from 0 again.
                "round": os.environ.get("TRAINKIT_JOB_STORE") or f"pid-{os.getpid()}",
                "rank": comm.get_rank(),
                "world_size": comm.get_world_size(),
                "iter": get_event_storage().iter,
                "ids": [int(x["image_id"]) for x in batched_inputs],
                "time": time.time(),
            }
            # One open per line: a SIGKILLed process loses at most the line it was writing.
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
        return original(self, batched_inputs)

    ImageClassifier.forward = forward


if os.environ.get("TRAINKIT_TEST_LEDGER"):
    _keep_ledger(os.environ["TRAINKIT_TEST_LEDGER"])

if KIND == "kill_during_save":
    _patch_save(lambda: os.kill(os.getpid(), signal.SIGKILL))
elif KIND == "enospc_on_save":

    def _enospc():
        raise OSError(errno.ENOSPC, "No space left on device")

    _patch_save(_enospc)
elif KIND == "nan_at_iter":
    _patch_forward(
        lambda n, out: {"loss_cls": out["loss_cls"] * float("nan")} if n == int(ARG) else out
    )
elif KIND == "raise_on_rank":
    rank_str, _, step_str = ARG.partition(":")
    step_str, _, round_str = step_str.partition(":")

    def _maybe_raise(n, out):
        from trainkit.launcher.restarts import restart_count
        from trainkit.utils import comm

        this_round = not round_str or restart_count() == int(round_str)
        if comm.get_rank() == int(rank_str) and n == int(step_str) and this_round:
            raise RuntimeError(f"injected failure on rank {rank_str} at step {step_str}")
        return out

    _patch_forward(_maybe_raise)
elif KIND == "sleep_at_iter":
    import time

    def _maybe_sleep(n, out):
        if n == int(ARG):
            with open(os.environ["TRAINKIT_TEST_MARKER"], "w"):
                pass
            time.sleep(60)
        return out

    _patch_forward(_maybe_sleep)
elif KIND == "stall_data_on_rank":
    import time

    from trainkit.data.mapping.mappers import ClassificationDatasetMapper

    original_mapper_call = ClassificationDatasetMapper.__call__
    rank_str, _, count_str = ARG.partition(":")
    mapped = [0]

    def stalling_call(self, record):
        from trainkit.utils import comm

        if self.is_train and comm.get_rank() == int(rank_str):
            mapped[0] += 1
            if mapped[0] == int(count_str):
                time.sleep(120)
        return original_mapper_call(self, record)

    ClassificationDatasetMapper.__call__ = stalling_call
elif KIND == "slow_data_on_rank":
    import time

    from trainkit.data.mapping.mappers import ClassificationDatasetMapper

    original_slow_call = ClassificationDatasetMapper.__call__
    slow_rank_str, _, delay_str = ARG.partition(":")

    def slow_call(self, record):
        from trainkit.utils import comm

        if self.is_train and comm.get_rank() == int(slow_rank_str):
            time.sleep(float(delay_str))
        return original_slow_call(self, record)

    ClassificationDatasetMapper.__call__ = slow_call
elif KIND in ("worker_dies", "mapper_raises"):
    from trainkit.data.mapping.mappers import ClassificationDatasetMapper

    original_call = ClassificationDatasetMapper.__call__
    seen = [0]

    def call(self, record):
        if KIND == "mapper_raises" and self.is_train and record["image_id"] % 7 == 0:
            raise ValueError(f"injected mapper failure for {record['file_name']}")
        if KIND == "worker_dies" and torch.utils.data.get_worker_info() is not None:
            seen[0] += 1
            if seen[0] == int(ARG):
                os.kill(os.getpid(), signal.SIGKILL)
        return original_call(self, record)

    ClassificationDatasetMapper.__call__ = call
elif FAULT:
    raise SystemExit(f"unknown TRAINKIT_TEST_FAULT {FAULT!r}")

if __name__ == "__main__":
    from trainkit.engine import default_argument_parser, launch

    args = default_argument_parser().parse_args()
    launch(
        train_net.main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
        max_restarts=args.max_restarts,
    )
