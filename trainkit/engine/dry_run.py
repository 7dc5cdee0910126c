"""The dry run: what a job of any size would do with a config, shown without training.

``--dry-run`` (:func:`~trainkit.engine.defaults.default_argument_parser`) stops a training
script in ``default_setup``, as ``--print-config`` does, and ``launch`` starts no process for
it, so ``--num-gpus 64 --num-machines 16`` runs in seconds on one CPU. It goes through the
code a real job runs: ``auto_scale_config`` for the job's world size (what
``DefaultTrainer.auto_scale_workers`` refuses is reported, not raised), the loader's checks,
catalog, sampler and batch plan (:meth:`~trainkit.data.spec.TrainDataSpec.from_config`), and
with ``--resume`` the newest checkpoint's run state (read, never loaded into a model) and
the recipe check of a resume on another world size.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from trainkit.config import CfgNode
from trainkit.config.scaling import SCALED_KEYS, ScalingError, auto_scale_config, check_same_recipe
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.engine.stragglers import check_straggler_config
from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import atomic_write

__all__ = ["dry_run", "format_dry_run", "run_dry_run"]

# What the text report shows of each step; --dry-run-json has everything.
_SHOWN_SLOTS = 6
_SHOWN_RECORDS = 6


def dry_run(
    cfg: CfgNode, world_size: int, *, resume: bool = False, num_steps: int = 3
) -> dict[str, Any]:
    """Return what a job of ``world_size`` processes would do with ``cfg``, as plain data.

    Args:
        cfg: the config as the script built it (not yet scaled).
        world_size: the job's processes (``--num-gpus`` x ``--num-machines``).
        resume: continue from the newest checkpoint in ``OUTPUT_DIR`` (``--resume``).
        num_steps: the optimizer steps whose records are listed.

    Returns:
        ``{"world_size", "recipe", "origins", "micro_batch_size", "refused", "notes",
        "resume", "steps"}``: ``recipe`` maps each key auto-scaling may change
        (``SCALED_KEYS``) to its value for this job (``origins``: where the changed ones
        came from); ``refused`` the one-line scaling errors that would stop it (as
        ``auto_scale_workers`` and a resume's recipe check raise them);
        ``resume`` ``{"checkpoint", "iteration", "step"}`` or None; ``steps`` one
        ``{"step", "rank", "micro_batch", "record_ids"}`` per rank and micro-batch of each
        listed step; ``datasets`` (with several ``DATASETS.TRAIN``) one ``{"step",
        "records": {name: count}}`` per listed step: its records of each dataset (with
        ``DATASETS.TRAIN_WEIGHTS``, the mix's exact shares).

    Raises:
        ConfigError: For any other config error, as the real job raises it (the loader's
            checks, the datasets, a saved position of another loader).
    """
    report: dict[str, Any] = {
        "world_size": world_size,
        "recipe": {},
        "micro_batch_size": None,
        "origins": {},
        "refused": [],
        "notes": [],
        "resume": None,
        "steps": [],
        "datasets": [],
    }
    try:
        scaled = auto_scale_config(cfg, world_size)
    except ScalingError as e:  # DefaultTrainer.auto_scale_workers would refuse the job
        report["refused"].append(f"auto_scale_workers: {e}")
        report["recipe"] = _recipe(cfg)
        return report
    report["recipe"] = _recipe(scaled)
    # Where each changed value came from ("auto-scaling from N to M processes (was V, ...)").
    unscaled = _recipe(cfg)
    report["origins"] = {
        key: scaled.get_origin(key)
        for key, value in report["recipe"].items()
        if value != unscaled[key]
    }
    try:
        _plan_steps(scaled, world_size, resume, num_steps, report)
    except ScalingError as e:  # the recipe would change on resuming (SCALE_MODE linear)
        report["refused"].append(f"resume: {e}")
    return report


def _recipe(cfg: CfgNode) -> dict[str, Any]:
    recipe = {}
    for key in SCALED_KEYS:
        section, leaf = key.split(".")
        value = cfg[section][leaf]
        recipe[key] = list(value) if isinstance(value, (tuple, list)) else value
    return recipe


def _plan_steps(
    cfg: CfgNode, world_size: int, resume: bool, num_steps: int, report: dict[str, Any]
) -> None:
    # Heavy imports (the data package) only for a dry run.
    from trainkit.data.plans.step_records import RecordsNotPlannedError
    from trainkit.data.spec import TrainDataSpec

    state, seed = None, None
    if resume:
        state, seed = _resume_state(cfg, world_size, report)
    seed = cfg.SEED if seed is None else seed
    try:
        if seed < 0:
            raise RecordsNotPlannedError(
                f"SEED={seed}: a run draws its data seed when it starts, so its records are "
                "not known before; set SEED >= 0 to fix them."
            )
        spec = TrainDataSpec.from_config(cfg, world_size=world_size, rank=0, seed=seed)
        listed = spec.steps_records(num_steps, state=state)
    except RecordsNotPlannedError as e:
        report["notes"].append(f"records not listed: {e}")
        return
    report["micro_batch_size"] = cfg.SOLVER.IMS_PER_BATCH // (
        world_size * cfg.SOLVER.ACCUMULATE_STEPS
    )
    if report["resume"] is not None and listed:
        report["resume"]["step"] = listed[0].step
    ids = spec.record_ids()
    if len(ids.names) > 1:  # how many records of each set every step holds (a mix's shares)
        for step in listed:
            per_dataset = dict.fromkeys(ids.names, 0)
            for index, _ in step.batch:
                per_dataset[ids.dataset(index)] += 1
            report["datasets"].append({"step": step.step, "records": per_dataset})
    for step in listed:
        for rank, micro_batch, pairs in step.slots():
            report["steps"].append(
                {
                    "step": step.step,
                    "rank": rank,
                    "micro_batch": micro_batch,
                    "record_ids": [ids(index) for index, _ in pairs],
                }
            )


def _resume_state(
    cfg: CfgNode, world_size: int, report: dict[str, Any]
) -> tuple[dict[str, Any] | None, int | None]:
    """The loader position and data seed a resumed job continues with (as resume_or_load)."""
    import torch

    from trainkit.checkpoint import Checkpointer, read_checkpoint_file

    path = Checkpointer(torch.nn.Module(), cfg.OUTPUT_DIR, save_to_disk=False)
    newest = path.get_checkpoint_file()
    if not newest:
        report["notes"].append(
            f"--resume: no checkpoint in OUTPUT_DIR {cfg.OUTPUT_DIR!r}; the run starts at "
            "iteration 0"
        )
        return None, None
    # Memory-mapped and dropped: the weights are never read into a model.
    checkpoint = read_checkpoint_file(newest, trust_pickle=False, keep_mapped=True)
    state = upgrade_run_state(checkpoint)
    last = state.get("iteration", checkpoint.get("iteration"))
    report["resume"] = {
        "checkpoint": newest,
        "iteration": None if last is None else last + 1,
        "step": None,
    }
    check_same_recipe(cfg, state["world_size"], world_size)
    if last is not None and last + 1 >= cfg.SOLVER.MAX_ITER:
        report["notes"].append(
            f"--resume: the checkpoint ends the run (SOLVER.MAX_ITER {cfg.SOLVER.MAX_ITER}); "
            "resuming trains nothing"
        )
    seed = state["seed"] if cfg.SEED < 0 and state["seed"] is not None else None
    data = continued_position(state, world_size)
    if data is None:
        report["notes"].append(
            f"--resume: the checkpoint of {state['world_size']} processes holds no position in "
            "the global stream; the data order starts afresh (steps listed from 0)"
        )
    return data, seed


def format_dry_run(report: dict[str, Any], num_gpus: int, num_machines: int) -> str:
    """Return the text ``--dry-run`` prints for :func:`dry_run`'s ``report``."""
    world_size = report["world_size"]
    lines = [
        f"Dry run of a job of {world_size} processes ({num_gpus} per machine x {num_machines} "
        "machine(s)): nothing is trained and no process is started.",
        "",
        "Recipe (the keys auto-scaling may change, for this job):",
    ]
    origins = report.get("origins", {})
    for key, value in report["recipe"].items():
        origin = origins.get(key)
        lines.append(f"  {key:<28} {value}" + (f"   ({origin})" if origin else ""))
    if report["micro_batch_size"] is not None:
        lines.append(
            f"  each process: {report['recipe']['SOLVER.ACCUMULATE_STEPS']} micro-batch(es) of "
            f"{report['micro_batch_size']} record(s) per optimizer step"
        )
    lines.append("")
    if report["refused"]:
        lines += [f"Refused: {reason}" for reason in report["refused"]]
    else:
        lines.append("Accepted: auto_scale_workers and the train loader's checks pass.")
    if report["resume"] is not None:
        resume = report["resume"]
        lines.append(
            f"Resume: {resume['checkpoint']}: training continues at iteration "
            f"{resume['iteration']}; the global stream at optimizer step {resume['step']}."
        )
    lines += [f"Note: {note}" for note in report["notes"]]
    lines += _format_steps(report["steps"], report.get("datasets", []))
    return "\n".join(lines) + "\n"


def _format_steps(steps: list[dict[str, Any]], datasets: list[dict[str, Any]]) -> list[str]:
    if not steps:
        return []
    lines = ["", "Records of the first steps (step, rank, micro-batch: record ids):"]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for entry in steps:
        by_step.setdefault(entry["step"], []).append(entry)
    per_dataset = {entry["step"]: entry["records"] for entry in datasets}
    for step, slots in by_step.items():
        counts = per_dataset.get(step)
        shares = "" if counts is None else ": " + ", ".join(f"{n} {c}" for n, c in counts.items())
        lines.append(f"  step {step}{shares}")
        shown = slots if len(slots) <= _SHOWN_SLOTS else slots[: _SHOWN_SLOTS - 1] + slots[-1:]
        for i, slot in enumerate(shown):
            if i == len(shown) - 1 and len(shown) < len(slots):
                lines.append(
                    f"    ... {len(slots) - len(shown)} more (--dry-run-json FILE lists them)"
                )
            ids = slot["record_ids"]
            text = ", ".join(ids[:_SHOWN_RECORDS])
            if len(ids) > _SHOWN_RECORDS:
                text += f", ... ({len(ids)} records)"
            lines.append(f"    rank {slot['rank']}, micro-batch {slot['micro_batch']}: {text}")
    return lines


def run_dry_run(cfg: CfgNode, args: argparse.Namespace) -> None:
    """Print the dry run of the job ``args`` describe (and write its JSON); exit.

    The world size is ``--num-gpus`` x ``--num-machines`` (never a running job's). Exits
    with status 0, or 2 when the job would be refused (the report says why).

    Raises:
        UsageError: For a LazyConfig, or a negative ``--dry-run-steps``.
        SystemExit: Always, after printing.
    """
    if not isinstance(cfg, CfgNode):
        raise UsageError(
            "--dry-run reads a yacs config (.yaml); a LazyConfig is not scaled to the world "
            "size, so there is no recipe to show. Use --print-config for its values."
        )
    num_steps = int(args.dry_run_steps)
    if num_steps < 0:
        raise UsageError(f"--dry-run-steps must be >= 0, got {num_steps}.")
    num_gpus, num_machines = int(args.num_gpus), int(args.num_machines)
    if num_gpus < 1 or num_machines < 1:
        raise UsageError(
            f"--num-gpus and --num-machines must be at least 1, got {num_gpus} and {num_machines}."
        )
    check_straggler_config(cfg)  # what the trainer checks first, before it trains
    report = dry_run(cfg, num_gpus * num_machines, resume=bool(args.resume), num_steps=num_steps)
    # Under torchrun every process gets here (launch starts none); one prints.
    if os.environ.get("RANK", "0") == "0":
        print(format_dry_run(report, num_gpus, num_machines), end="", flush=True)  # noqa: T201
        json_file = args.dry_run_json
        if json_file:
            with atomic_write(json_file, "w") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
    raise SystemExit(2 if report["refused"] else 0)
