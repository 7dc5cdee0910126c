"""What a training script needs around the trainer: the command line and the run's set-up.

``DefaultTrainer``, ``default_writers`` and ``create_ddp_model`` are importable from here too,
detectron2's path (this module imports them, none of them imports this one).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import torch

from trainkit.config.run_config import RunConfig, run_config
from trainkit.engine.default_trainer import DefaultTrainer
from trainkit.engine.gradients import create_ddp_model
from trainkit.engine.predictor import DefaultPredictor
from trainkit.engine.writers import default_writers
from trainkit.utils import comm
from trainkit.utils.collect_env import format_env_info
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError, install_usage_error_handler
from trainkit.utils.file_io import PathManager, atomic_write
from trainkit.utils.logger import setup_logger

__all__ = [
    "DefaultPredictor",
    "DefaultTrainer",
    "OutputDirError",
    "check_output_dir",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "default_writers",
]

logger = logging.getLogger(__name__)


def default_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """Return the training scripts' parser: detectron2's flags, --max-restarts, --print-config.

    Args:
        epilog: text shown after the flags in ``--help``.
    """
    # Every script built the detectron2 way starts here: from now on an uncaught user error
    # ends it with one line and exit status 2 (see trainkit.utils.errors).
    install_usage_error_handler()
    return _parser(epilog)


def command_line(args: Any) -> argparse.Namespace:
    """Return ``args`` with every flag of :func:`default_argument_parser`, defaults filled in.

    detectron2 scripts hand ``default_setup`` their own namespace, a dict or ``None``.
    """
    given = {} if args is None else dict(args) if isinstance(args, dict) else vars(args)
    return argparse.Namespace(**{**vars(_parser(None).parse_args([])), **given})


def _parser(epilog: str | None) -> argparse.ArgumentParser:
    epilog = epilog or (
        "Examples:\n"
        f"  Train on 8 GPUs:      {sys.argv[0]} --num-gpus 8 --config-file cfg.yaml\n"
        f"  Change a setting:     {sys.argv[0]} --config-file cfg.yaml SOLVER.BASE_LR 0.01\n"
        f"  Evaluate weights:     {sys.argv[0]} --config-file cfg.yaml --eval-only "
        "MODEL.WEIGHTS /path/to/model_final.pth\n"
        "  Two machines (run on each, with its own --machine-rank):\n"
        f"    {sys.argv[0]} --config-file cfg.yaml --num-gpus 8 --num-machines 2 "
        "--machine-rank 0 --dist-url tcp://HOST0:29500\n"
        f"  What 128 GPUs would do (here, in seconds): {sys.argv[0]} --config-file cfg.yaml "
        "--dry-run --num-gpus 8 --num-machines 16\n"
    )
    parser = argparse.ArgumentParser(
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config-file", default="", metavar="FILE", help="path to a YAML config (or a LazyConfig)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint in OUTPUT_DIR (its last_checkpoint file); "
        "without it, training starts at iteration 0 from MODEL.WEIGHTS",
    )
    parser.add_argument("--eval-only", action="store_true", help="only evaluate MODEL.WEIGHTS")
    parser.add_argument("--num-gpus", type=int, default=1, help="processes per machine")
    parser.add_argument("--num-machines", type=int, default=1, help="machines in the job")
    parser.add_argument(
        "--machine-rank", type=int, default=0, help="index of this machine (0 ... num-machines - 1)"
    )
    parser.add_argument(
        "--dist-url",
        default="auto",
        help="rendezvous: 'auto' (one machine, private loopback port) or tcp://HOST:PORT of "
        "machine 0 for several machines",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print every config key that differs from the defaults, with its value and where "
        "it came from (FILE:LINE, command line, auto-scaling), then exit without training",
    )
    dry_run = parser.add_argument_group(
        "dry run",
        "show what a job of --num-gpus x --num-machines processes would do, on this machine, "
        "in seconds: the scaled recipe, what auto-scaling refuses, the records of the first "
        "steps per rank and micro-batch, with --resume where the data stream continues, and "
        "the bytes of parameters, gradients and optimizer state per process (as configured, "
        "FSDP or DDP, and under DDP; the model built on the meta device, activations not "
        "counted). "
        "Nothing is trained and no process is started (exit status 2 if the job would be "
        "refused).",
    )
    dry_run.add_argument(
        "--dry-run", action="store_true", help="print the dry run, then exit without training"
    )
    dry_run.add_argument(
        "--dry-run-json",
        metavar="FILE",
        action=_DryRunJson,
        help="also write it to FILE as JSON ({recipe, steps: [{step, rank, micro_batch, "
        "record_ids}], memory: {strategy, shard_size, per_process, ddp_per_process}, ...}); "
        "implies --dry-run",
    )
    dry_run.add_argument(
        "--dry-run-steps",
        type=int,
        default=3,
        metavar="N",
        help="the optimizer steps whose records the dry run lists (default 3)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="restart the job up to N times after a process fails (on every machine); a "
        "restarted job resumes from its newest checkpoint by itself",
    )
    parser.add_argument(
        "opts",
        default=None,
        nargs=argparse.REMAINDER,
        help="config overrides: KEY VALUE pairs for a YAML config (SOLVER.BASE_LR 0.01), "
        "KEY=VALUE for a LazyConfig (optimizer.lr=0.01)",
    )
    return parser


class _DryRunJson(argparse.Action):
    """``--dry-run-json FILE``: keep FILE and ask for the dry run."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.dry_run = True


def default_setup(cfg: Any, args: argparse.Namespace | None = None) -> Any:
    """Prepare the run: output directory, logs, environment record, scaling, config dump, seeds.

    Rank 0 logs to the console and ``OUTPUT_DIR/log.txt``; rank N to ``log.txt.rankN``. ``cfg`` is
    rescaled in place to the world size (:func:`~trainkit.config.scaling.auto_scale_config`); then
    rank 0 writes ``OUTPUT_DIR/config.yaml`` (the config the run uses), ``config_origins.yaml``
    (each key a file, the command line or code set, and where its value came from) and ``env.txt``,
    and logs the detectron2-only keys a file or the command line set that trainkit never reads.

    With ``args.print_config`` (``--print-config``) it prints those keys instead, scaled to
    the job's world size, and exits with status 0 (``launch`` starts no process for it).
    With ``args.dry_run`` (``--dry-run``) it prints the job's dry run
    (:func:`~trainkit.engine.dry_run.run_dry_run`) and exits, the same way: nothing is written.

    A LazyConfig (an omegaconf ``DictConfig``, as detectron2 accepts) is set up the same way
    (:mod:`~trainkit.config.run_config`) from ``train.output_dir``, ``train.seed``,
    ``train.cudnn_benchmark`` and ``train.init_checkpoint``: ``config.yaml`` is written with
    ``LazyConfig.save``, every value listed with its origin, nothing rescaled; it stays mutable.

    Args:
        cfg: the full config: a ``CfgNode`` or a LazyConfig.
        args: the parsed command line (logged), or None.

    Returns:
        ``cfg``: frozen if a ``CfgNode``.

    Raises:
        OutputDirError: If the output directory cannot be created or written.
        UsageError: If the weights name no file, or ``--eval-only`` has no weights.
        ScalingError: If the config cannot be scaled to the world size.
        SystemExit: 0 after printing (``args.print_config``) or a dry run, 2 if it refuses the job.
    """
    run, flags = run_config(cfg), command_line(args)
    if flags.print_config:
        _print_config_and_exit(run, flags)
    if flags.dry_run:
        from trainkit.engine.dry_run import run_dry_run  # the data package, only for it

        run_dry_run(cfg, flags)
    run.check_weights(eval_only=flags.eval_only, resume=flags.resume)
    output_dir, rank = run.output_dir, comm.get_rank()
    if output_dir:
        check_output_dir(output_dir)
    setup_logger(output_dir or None, distributed_rank=rank, name="trainkit")
    setup_logger(output_dir or None, distributed_rank=rank, name="fvcore")
    logger.info("Rank %d of %d (local rank %d)", rank, comm.get_world_size(), comm.get_local_rank())
    env_table = format_env_info()
    if rank == 0:
        logger.info("Environment:\n%s", env_table)
    if args is not None:
        logger.info("Command line arguments: %s", args)
        if flags.config_file:
            with PathManager.open(flags.config_file, "r") as f:
                logger.info("Contents of %s:\n%s", flags.config_file, f.read())
    # Before the dump, so config.yaml holds the config the run uses.
    run.scale_in_place(comm.get_world_size())
    if rank == 0 and output_dir:
        run.write_receipts(output_dir)
        with atomic_write(os.path.join(output_dir, "env.txt"), "w") as f:
            f.write(env_table + "\n")
    if rank == 0 and (unused := run.unused_keys()):
        # detectron2 accepts its detection keys silently; say once that trainkit's code
        # ignores the ones a file or the command line set (a project's code may read them).
        logger.info(
            "Config keys set but not used by trainkit (detectron2 keys that only a project's "
            "own code reads): %s",
            ", ".join(unused),
        )
    # Each rank gets a different seed for its own random ops; the data order uses a
    # separate seed shared by all ranks (see build_train_loader).
    seed = seed_all_rng(None if run.seed < 0 else run.seed + rank)
    logger.info("Seeded torch, numpy and random with %d on rank %d", seed, rank)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = run.cudnn_benchmark
    run.freeze()  # a LazyConfig stays mutable, as in detectron2 (scripts edit it)
    return cfg


def _print_config_and_exit(run: RunConfig, args: argparse.Namespace) -> None:
    # The world size the job would have: the process group's, torchrun's, or the flags'.
    world_size = comm.get_world_size()
    if world_size == 1:
        world_size = int(os.environ.get("WORLD_SIZE", int(args.num_gpus) * int(args.num_machines)))
    scaled = run.scaled(world_size)
    # Under torchrun every process gets here (launch starts none); one prints.
    if os.environ.get("RANK", "0") == "0":
        header = (
            f"Config keys set by a file, the command line or code, for a job of {world_size} "
            f"process{'es' if world_size > 1 else ''}: the value, then where it came from."
        )
        print(scaled.report(header), end="", flush=True)  # noqa: T201 - what --print-config asks
    raise SystemExit(0)


class OutputDirError(UsageError, PermissionError):
    """``OUTPUT_DIR`` cannot be created or written; the message names it."""


def check_output_dir(output_dir: str) -> None:
    """Create ``output_dir`` if needed and check that this user can write to it.

    Raises:
        OutputDirError: With a message naming the directory and the fix.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise OutputDirError(
            f"OUTPUT_DIR {output_dir!r} cannot be created ({e.strerror}); set OUTPUT_DIR to a "
            f"writable directory."
        ) from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputDirError(
            f"OUTPUT_DIR {output_dir!r} is not writable by this user; set OUTPUT_DIR to a "
            f"writable directory or fix its permissions."
        )
