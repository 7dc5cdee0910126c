#!/usr/bin/env python
"""Replay a failing training step that a run captured, on one process, on any machine.

    python tools/replay_step.py OUTPUT_DIR/failed_steps/iter_37
    python tools/replay_step.py OUTPUT_DIR/failed_steps/iter_37 --trainer my_project.train:Trainer
    python tools/replay_step.py OUTPUT_DIR/failed_steps/iter_37 \
        --checkpoint OUTPUT_DIR/model_0000019.pth --save-weights before_step_37.pth

The run's folder names its trainer class (``tools/train_net.py``'s ``Trainer``, or your
script's); ``--trainer`` gives another (``module:Class`` or ``path/to/script.py:Class``). From
your own script, call :func:`trainkit.engine.replay.replay_failed_step` with your class.
The exit status is the run's when the failure is reproduced (65 for a non-finite loss, 1 for
an exception), 0 when the step went through, 2 for a folder that cannot be replayed.
"""

import argparse
import os
import sys

import torch

from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE
from trainkit.utils.errors import install_usage_error_handler
from trainkit.utils.file_io import atomic_write
from trainkit.utils.logger import setup_logger


def parse_args(argv=None):
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="OUTPUT_DIR/failed_steps/iter_<N> written by the run")
    parser.add_argument("--trainer", help="module:Class or path/to/script.py:Class of the trainer")
    parser.add_argument("--checkpoint", default=None, help="start from this checkpoint instead")
    parser.add_argument("--output-dir", default=None, help="where the replay may write files")
    parser.add_argument(
        "--save-weights",
        default=None,
        metavar="FILE",
        help="save the model's weights before the failing step ({'model': state_dict})",
    )
    return parser.parse_args(argv)


def main(args) -> int:
    """Replay, print the report; return the exit status (see the module docstring)."""
    from trainkit.engine.failed_steps import load_trainer_class
    from trainkit.engine.replay import replay_failed_step

    setup_logger(name="trainkit")
    trainer_class = load_trainer_class(args.trainer) if args.trainer else None
    report = replay_failed_step(
        args.folder,
        trainer_class,
        checkpoint=args.checkpoint,
        output_dir=args.output_dir,
        log=print,
    )
    if args.save_weights:
        os.makedirs(os.path.dirname(os.path.abspath(args.save_weights)), exist_ok=True)
        with atomic_write(args.save_weights, "wb") as f:
            torch.save({"model": report.weights, "iteration": report.iteration - 1}, f)
    print("\n".join(report.lines()))
    if not report.reproduced:
        return 0
    return 1 if report.errors else NON_FINITE_EXIT_CODE


if __name__ == "__main__":
    install_usage_error_handler()
    sys.exit(main(parse_args()))
