#!/usr/bin/env python
"""Convert a checkpoint between a sharded run's directory and a DDP run's file, either way.

    python tools/convert_checkpoint.py output/fsdp/model_0000005 output/ddp/model_0000005.pth
    python tools/convert_checkpoint.py output/ddp/model_0000005.pth output/fsdp/model_0000005 --tag

The direction follows SRC. A directory (written with ``MODEL.FSDP.ENABLED``: DCP's shards and
``run.pth``) becomes the one file a DDP run of the same config writes at that iteration: to
share, to evaluate or start from (``MODEL.WEIGHTS``), or for code that reads ``.pth`` files.
A file becomes a directory a sharded run resumes from with every process reading only its own
shards of the parameters and of their optimizer state (from a file, each process reads all
of it). DST holds all SRC holds: weights, optimizer state, run state (iteration, hooks, data
position, RNG states). ``--resume`` already reads either kind, so converting is never needed
just to change between FSDP and DDP.

A file written before checkpoints recorded the optimizer's parameter names (or a bare state
dict, or a detectron2-style checkpoint) converts without its optimizer state, with a warning:
the run resumed from DST starts its optimizer afresh.

``--resume`` continues from the checkpoint that DST's directory's ``last_checkpoint`` tag
names: ``--tag`` points the tag at DST; without it the tag is left as it is and the tool says
how to set it. DST is never replaced without ``--force``. The exit status is 0 on success and
2 (with one line saying why) for arguments it refuses.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from trainkit.checkpoint import is_checkpoint_dir, read_checkpoint_file
from trainkit.checkpoint.sharded import (
    publish_directory,
    read_sharded_checkpoint,
    write_sharded_checkpoint,
)
from trainkit.utils.errors import MissingFileError, UsageError, install_usage_error_handler
from trainkit.utils.file_io import atomic_write

# The file in a run's OUTPUT_DIR naming the checkpoint --resume loads (fvcore's name).
_TAG_FILE = "last_checkpoint"
_SUFFIX = ".pth"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", metavar="SRC", help="a checkpoint directory or a .pth file")
    parser.add_argument("dst", metavar="DST", help="the .pth file or directory to write")
    parser.add_argument("--force", action="store_true", help="replace DST if it exists")
    parser.add_argument(
        "--tag",
        action="store_true",
        help=f"point DST's directory's {_TAG_FILE} tag at DST, so --resume there continues from it",
    )
    return parser.parse_args(argv)


def check_paths(src: str, dst: str, force: bool) -> bool:
    """Refuse a conversion that cannot be made; return whether SRC is a directory.

    Raises:
        MissingFileError: If ``src`` does not exist.
        UsageError: If ``src`` is an incomplete directory, ``dst`` is of ``src``'s kind, or
            ``dst`` exists and ``force`` is False.
    """
    if not os.path.exists(src):
        raise MissingFileError(
            f"{src} does not exist; pass a checkpoint file (model_0000005.pth) or a sharded "
            "checkpoint directory (model_0000005)."
        )
    src_is_dir = os.path.isdir(src)
    if src_is_dir and not is_checkpoint_dir(src):
        raise UsageError(
            f"{src} is not a complete sharded checkpoint directory (it lacks .metadata or "
            "run.pth: a save that did not finish, or another directory); pass a complete one."
        )
    if src_is_dir and (os.path.isdir(dst) or not dst.endswith(_SUFFIX)):
        what = "a directory" if os.path.isdir(dst) else f"not a {_SUFFIX} file name"
        raise UsageError(
            f"{dst} is {what}, but the directory {src} converts to a file (a DDP run's "
            f"checkpoint); name DST like model_0000005{_SUFFIX}."
        )
    if not src_is_dir and (os.path.isfile(dst) or dst.endswith(_SUFFIX)):
        raise UsageError(
            f"{dst} names a file, but the file {src} converts to a sharded checkpoint "
            "directory; name DST like model_0000005 (no suffix)."
        )
    if os.path.exists(dst) and not force:
        raise UsageError(f"{dst} exists; pass --force to replace it, or choose another DST.")
    return src_is_dir


def directory_to_file(src: str, dst: str) -> dict[str, Any]:
    """Write the sharded checkpoint directory ``src`` as the checkpoint file ``dst``.

    The file holds what a DDP run writes: the directory's dict with every sharded entry
    read back whole (:func:`~trainkit.checkpoint.sharded.read_sharded_checkpoint`).

    Returns:
        The checkpoint written.
    """
    with _alone():
        checkpoint = read_sharded_checkpoint(src, None)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with atomic_write(dst, "wb") as f:
        torch.save(checkpoint, f)
    return checkpoint


def file_to_directory(src: str, dst: str) -> tuple[dict[str, Any], str | None]:
    """Write the checkpoint file ``src`` as a sharded checkpoint directory ``dst``.

    The parameters and the optimizer's per-parameter tensors go into DCP's files (each whole:
    a sharded run reads its shards of them), the rest into ``run.pth``. Which model entries
    are parameters is what the trainer recorded beside the optimizer state
    (``parameter_names``); a state without them is dropped, and the weights stay whole in
    ``run.pth``.

    Returns:
        ``(checkpoint, warning)``: the checkpoint converted (less a dropped optimizer state),
        and a one-line warning when parameter names were missing, else ``None``.
    """
    checkpoint = read_checkpoint_file(src, trust_pickle=False)
    selected, named, dropped = _select_parameters(checkpoint)
    warning = None
    if dropped or not named:
        warning = (
            f"warning: {src} records no optimizer parameter names (written by an older trainkit "
            "or another trainer): "
            + (
                "its optimizer state is dropped, so a run resumed from it starts the optimizer "
                "afresh (no momentum or Adam moments), and "
                if dropped
                else ""
            )
            + "its weights are kept whole in run.pth (each process reads them whole)."
        )
    parent = os.path.dirname(os.path.abspath(dst))
    partial = os.path.join(parent, f".{os.path.basename(os.path.abspath(dst))}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted conversion
    os.makedirs(partial)
    with _alone():
        write_sharded_checkpoint(
            checkpoint, partial, is_writer=True, select=lambda path, _: path in selected
        )
    publish_directory(partial, os.path.abspath(dst))
    return checkpoint, warning


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    # DCP's notice that it reads or writes without a process group: that is the point here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _select_parameters(checkpoint: dict[str, Any]) -> tuple[set[tuple[Any, ...]], bool, bool]:
    """Return the paths of the parameters and of their optimizer tensors, and what was missing.

    A step trainer's state holds ``"optimizer"`` (index-keyed) beside ``"parameter_names"``
    (the model entry of each index); an optimizer's per-parameter tensor is one shaped like
    its parameter (not Adam's ``step``). An optimizer state without names is deleted from
    ``checkpoint``: it cannot be matched to the parameters.

    Returns:
        ``(paths, named, dropped)``: the selected paths, whether some optimizer state had
        names, and whether one without was dropped.
    """
    model = checkpoint.get("model")
    model = model if isinstance(model, dict) else {}
    selected: set[tuple[Any, ...]] = set()
    named = dropped = False
    for path, holder in _optimizer_holders(checkpoint, ()):
        names = holder.get("parameter_names")
        if not isinstance(names, list):
            del holder["optimizer"]
            dropped = True
            continue
        named = True
        selected.update(("model", name) for name in names if torch.is_tensor(model.get(name)))
        for index, per_param in holder["optimizer"]["state"].items():
            known = isinstance(index, int) and 0 <= index < len(names)
            param = model.get(names[index]) if known else None
            if not torch.is_tensor(param) or not isinstance(per_param, dict):
                continue
            selected.update(
                (*path, "optimizer", "state", index, key)
                for key, value in per_param.items()
                if torch.is_tensor(value) and value.shape == param.shape
            )
    return selected, named, dropped


def _optimizer_holders(obj: Any, path: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], dict]]:
    # Every dict (outside the model's state) holding an optimizer's state_dict() under
    # "optimizer": DefaultTrainer's trainer._trainer, a step trainer's own trainer entry, or
    # a detectron2-style checkpoint's top level.
    if not isinstance(obj, dict):
        return []
    found = []
    optimizer = obj.get("optimizer")
    if isinstance(optimizer, dict) and {"state", "param_groups"} <= set(optimizer):
        found.append((path, obj))
    for key, value in obj.items():
        if key not in ("model", "optimizer"):
            found += _optimizer_holders(value, (*path, key))
    return found


def tag_last_checkpoint(dst: str) -> str:
    """Atomically point the ``last_checkpoint`` tag of ``dst``'s directory at ``dst``.

    Returns:
        A line saying so, and how to resume from it.
    """
    directory, name = os.path.split(os.path.abspath(dst))
    tag_path = os.path.join(directory, _TAG_FILE)
    with atomic_write(tag_path, "w") as f:
        f.write(name)
    return f"Tagged it in {tag_path}: --resume with OUTPUT_DIR {directory} continues from it."


def _resume_hint(dst: str) -> str:
    directory, name = os.path.split(os.path.abspath(dst))
    tag_path = os.path.join(directory, _TAG_FILE)
    current = ""
    if os.path.isfile(tag_path):
        with open(tag_path) as f:
            current = f" (it names {f.read().strip() or 'nothing'} now, left as it is)"
    return (
        f"To resume from it: `echo -n {name} > {tag_path}`{current}, or convert with --tag; "
        f"then --resume with OUTPUT_DIR {directory}."
    )


def main(argv: list[str] | None = None) -> int:
    """Convert SRC to DST (see the module docstring), print what was written; return 0.

    Raises:
        UsageError: For arguments it refuses (:func:`check_paths`) and unreadable checkpoints.
    """
    args = parse_args(argv)
    if check_paths(args.src, args.dst, args.force):
        checkpoint = directory_to_file(args.src, args.dst)
    else:
        checkpoint, warning = file_to_directory(args.src, args.dst)
        if warning:
            print(warning, file=sys.stderr)
    iteration = checkpoint.get("iteration")
    print(
        f"Wrote {args.dst} from {args.src}"
        + (f" (iteration {iteration})." if iteration is not None else ".")
    )
    print(tag_last_checkpoint(args.dst) if args.tag else _resume_hint(args.dst))
    return 0


if __name__ == "__main__":
    install_usage_error_handler()  # a refused argument: one line, exit status 2
    sys.exit(main())
