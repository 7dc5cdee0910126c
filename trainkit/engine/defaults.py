"""The pieces a training script needs around the trainer: command line and run set-up.

``DefaultTrainer``, ``default_writers`` and ``create_ddp_model`` live in their own modules
and are importable from here too (``from trainkit.engine.defaults import DefaultTrainer``, as
in detectron2).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import torch

from trainkit.config import CfgNode
from trainkit.engine.ddp import create_ddp_model
from trainkit.engine.writers import default_writers
from trainkit.utils import comm
from trainkit.utils.collect_env import format_env_info
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import MissingFileError, UsageError, install_usage_error_handler
from trainkit.utils.file_io import PathManager, atomic_write
from trainkit.utils.logger import setup_logger

# DefaultTrainer is importable from here too (see __getattr__ at the end).
__all__ = [
    "OutputDirError",
    "check_output_dir",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "default_writers",
]

logger = logging.getLogger(__name__)


def default_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser shared by training scripts (detectron2's flags).

    Args:
        epilog: text shown after the flags in ``--help``.

    Returns:
        A parser with ``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``,
        ``--num-machines``, ``--machine-rank``, ``--dist-url``, ``--max-restarts`` and
        trailing ``opts``.
    """
    epilog = epilog or (
        "Examples:\n"
        f"  Train on 8 GPUs:      {sys.argv[0]} --num-gpus 8 --config-file cfg.yaml\n"
        f"  Change a setting:     {sys.argv[0]} --config-file cfg.yaml SOLVER.BASE_LR 0.01\n"
        f"  Evaluate weights:     {sys.argv[0]} --config-file cfg.yaml --eval-only "
        "MODEL.WEIGHTS /path/to/model_final.pth\n"
        "  Two machines (run on each, with its own --machine-rank):\n"
        f"    {sys.argv[0]} --config-file cfg.yaml --num-gpus 8 --num-machines 2 "
        "--machine-rank 0 --dist-url tcp://HOST0:29500\n"
    )
    # Every script built the detectron2 way starts here: from now on an uncaught user error
    # ends it with one line and exit status 2 (see trainkit.utils.errors).
    install_usage_error_handler()
    parser = argparse.ArgumentParser(
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to a YAML config")
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
        help="config overrides as KEY VALUE pairs, e.g. SOLVER.BASE_LR 0.01 SOLVER.MAX_ITER 100",
    )
    return parser


def default_setup(cfg: CfgNode, args: argparse.Namespace | None = None) -> CfgNode:
    """Prepare the run: output directory, logs, environment record, config dump, seeds.

    Rank 0 logs to the console and ``OUTPUT_DIR/log.txt``; rank N to ``log.txt.rankN``.
    Rank 0 writes ``OUTPUT_DIR/config.yaml`` (the resolved config) and ``env.txt``.
    The config is frozen afterwards.

    Args:
        cfg: the full config.
        args: the parsed command line (logged); may be None.

    Returns:
        ``cfg``, frozen.

    Raises:
        OutputDirError: If ``OUTPUT_DIR`` cannot be created or written.
        UsageError: If ``MODEL.WEIGHTS`` names no file, or ``--eval-only`` has no weights.
    """
    output_dir = cfg.OUTPUT_DIR
    rank = comm.get_rank()
    if output_dir:
        check_output_dir(output_dir)
    _check_weights_argument(cfg, args)
    setup_logger(output_dir or None, distributed_rank=rank, name="trainkit")
    setup_logger(output_dir or None, distributed_rank=rank, name="fvcore")
    logger.info("Rank %d of %d (local rank %d)", rank, comm.get_world_size(), comm.get_local_rank())
    env_table = format_env_info()
    if rank == 0:
        logger.info("Environment:\n%s", env_table)
    if args is not None:
        logger.info("Command line arguments: %s", args)
        if getattr(args, "config_file", ""):
            with PathManager.open(args.config_file, "r") as f:
                logger.info("Contents of %s:\n%s", args.config_file, f.read())
    if rank == 0 and output_dir:
        with atomic_write(os.path.join(output_dir, "config.yaml"), "w") as f:
            f.write(cfg.dump())
        with atomic_write(os.path.join(output_dir, "env.txt"), "w") as f:
            f.write(env_table + "\n")
        logger.info("Full config saved to %s", os.path.join(output_dir, "config.yaml"))
    # Each rank gets a different seed for its own random ops; the data order uses a
    # separate seed shared by all ranks (see build_train_loader).
    seed = seed_all_rng(None if cfg.SEED < 0 else cfg.SEED + rank)
    logger.info("Seeded torch, numpy and random with %d on rank %d", seed, rank)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = bool(cfg.CUDNN_BENCHMARK)
    cfg.freeze()
    return cfg


class OutputDirError(UsageError, PermissionError):
    """``OUTPUT_DIR`` cannot be created or written; the message names it."""


def _check_weights_argument(cfg: CfgNode, args: Any) -> None:
    weights = cfg.MODEL.WEIGHTS
    if weights and "://" not in weights and not os.path.isfile(weights):
        raise MissingFileError(f"MODEL.WEIGHTS file not found: {weights}. Check the path.")
    if getattr(args, "eval_only", False) and not weights and not getattr(args, "resume", False):
        raise UsageError(
            "--eval-only needs MODEL.WEIGHTS (or --resume to use OUTPUT_DIR's last checkpoint)."
        )


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


def __getattr__(name: str) -> Any:
    # DefaultTrainer imports this module's neighbours; resolve it lazily to avoid a cycle.
    if name == "DefaultTrainer":
        from trainkit.engine.default_trainer import DefaultTrainer

        return DefaultTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
