"""The dry run: what a job of any size would do with a config, shown without training.

``--dry-run`` (:func:`~trainkit.engine.defaults.default_argument_parser`) stops a training
script in ``default_setup``, as ``--print-config`` does, and ``launch`` starts no process for
it, so ``--num-gpus 64 --num-machines 16`` runs in seconds on one CPU. It goes through the
code a real job runs: for a yacs config ``auto_scale_config`` for the job's world size (what
``DefaultTrainer.auto_scale_workers`` refuses is reported, not raised); the train data as the
loader gets it, a :class:`~trainkit.data.spec.TrainDataSpec` (from the config, or from a
LazyConfig's ``dataloader.train`` arguments, without building the loader) and its batch
plan; with ``--resume`` the newest checkpoint's run state (read, never loaded into a model)
and the recipe check of a resume on another world size; and the bytes one process holds of
the model's parameters, gradients and optimizer state under the configured strategy (FSDP or
DDP) and under DDP, from the model built on the meta device
(:mod:`~trainkit.engine.dry_run_memory`).

A map-style dataset's steps are listed for every rank and micro-batch; only the records they draw
are read (and, with aspect-ratio grouping, those the plan passes that wait in buckets), so a
metadata file of 4e8 records with its line index built lists in seconds. A stream dataset has no
plan: its loader workers form the batches, so the dry run lists what this process's loader with the
configured ``NUM_WORKERS`` yields, batch by batch, with the worker each batch came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from trainkit.checkpoint import Checkpointer, read_unsharded_part
from trainkit.config import ConfigError
from trainkit.config.run_config import RunConfig, run_config
from trainkit.config.scaling import ScalingError
from trainkit.data import TrainDataSpec
from trainkit.data.build import train_data_spec
from trainkit.data.loading.loader import TrainLoader
from trainkit.data.plans.step_records import RecordsNotPlannedError, record_label
from trainkit.engine.dry_run_memory import (
    MemoryNotCountedError,
    build_model_override_note,
    format_memory,
    script_trainers,
    shard_group_size,
    state_memory,
)
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.engine.stragglers import check_straggler_config
from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import atomic_write

__all__ = ["dry_run", "format_dry_run", "run_dry_run"]

# What the text report shows of each step; --dry-run-json has everything.
_SHOWN_SLOTS = 6
_SHOWN_RECORDS = 6
_SHOWN_CHARS = 60  # of an element of a stream that has no id of its own


def dry_run(
    cfg: Any,
    world_size: int,
    *,
    resume: bool = False,
    num_steps: int = 3,
    local_size: int | None = None,
    trainers: Sequence[type] = (),
) -> dict[str, Any]:
    """Return what a job of ``world_size`` processes would do with ``cfg``, as plain data.

    Args:
        cfg: the config as the script built it (a yacs config, not yet scaled, or a LazyConfig).
        world_size: the job's processes (``--num-gpus`` x ``--num-machines``).
        resume: continue from the newest checkpoint in the output directory (``--resume``).
        num_steps: the optimizer steps whose records are listed.
        local_size: the processes per machine (``--num-gpus``); ``None``: one machine.
        trainers: the script's ``DefaultTrainer`` subclasses; a note says when one overrides
            ``build_model`` (the memory figures are the registry's model's).

    Returns:
        ``{"world_size", "recipe", "rescaled", "origins", "micro_batch_size", "accumulate_steps",
        "refused", "notes", "resume", "steps", "datasets"}``: ``recipe`` maps each key auto-scaling
        may change (``SCALED_KEYS``) to its value for this job (a LazyConfig's, as written:
        ``rescaled`` is false; ``origins``: where the changed ones came from); ``refused`` the
        one-line scaling errors that would stop it (as ``auto_scale_workers`` and a resume's recipe
        check raise them); ``resume`` ``{"checkpoint", "iteration", "step"}`` or None; ``steps`` one
        ``{"step", "rank", "micro_batch", "record_ids"}`` per rank and micro-batch of each step (for
        a stream, rank 0's batches, each with the loader ``"worker"`` that formed it); ``datasets``
        (with several ``DATASETS.TRAIN``) one ``{"step", "records": {name: count}}`` per listed
        step: its records of each dataset (with ``DATASETS.TRAIN_WEIGHTS``, the mix's exact shares);
        ``memory`` :func:`~trainkit.engine.dry_run_memory.state_memory`'s figures (``None``
        when a shard size is refused or the model cannot be built on the meta device: a
        ``refused`` line or a note says why).

    Raises:
        ConfigError: For any other config error, as the real job raises it (the loader's
            checks, the datasets, a saved position of another loader, the model's
            architecture or optimizer).
    """
    run = run_config(cfg)
    report: dict[str, Any] = {
        "world_size": world_size,
        "recipe": run.recipe(),
        "rescaled": run.rescaled,
        "micro_batch_size": None,
        "accumulate_steps": None,
        "origins": {},
        "refused": [],
        "notes": [],
        "resume": None,
        "steps": [],
        "datasets": [],
        "memory": None,
    }
    try:
        scaled = run.scaled(world_size)
    except ScalingError as e:  # DefaultTrainer.auto_scale_workers would refuse the job
        report["refused"].append(f"auto_scale_workers: {e}")
    else:
        written, report["recipe"] = report["recipe"], scaled.recipe()
        changed = [key for key, value in report["recipe"].items() if value != written[key]]
        report["origins"] = {key: scaled.origin(key) for key in changed}
        try:
            _plan_steps(scaled, world_size, resume, num_steps, report)
        except ScalingError as e:  # the recipe would change on resuming (SCALE_MODE linear)
            report["refused"].append(f"resume: {e}")
    # Also for a refused recipe: the state's bytes do not depend on it.
    _count_memory(cfg, world_size, local_size or world_size, trainers, report)
    return report


def _count_memory(
    cfg: Any, world_size: int, local_size: int, trainers: Sequence[type], report: dict[str, Any]
) -> None:
    try:
        group_size = shard_group_size(cfg, world_size, local_size)
    except ConfigError as e:  # shard_model would refuse the job's mesh
        report["refused"].append(f"shard_model: {e}")
        return
    try:
        report["memory"] = state_memory(cfg, group_size)
    except MemoryNotCountedError as e:
        report["notes"].append(f"memory not counted: {e}")
        return
    if (note := build_model_override_note(cfg, trainers)) is not None:
        report["notes"].append(note)


def _plan_steps(
    run: RunConfig, world_size: int, resume: bool, num_steps: int, report: dict
) -> None:
    state, seed = None, run.data_seed
    if resume:
        state, seed = _resume_state(run, world_size, report)
    try:
        if seed < 0:
            raise RecordsNotPlannedError(
                f"SEED={seed}: a run draws its data seed when it starts, so its records are "
                "not known before; set SEED >= 0 to fix them."
            )
        spec = train_data_spec(run, world_size=world_size, rank=0, seed=seed)
        report["micro_batch_size"] = spec.micro_batch_size
        report["accumulate_steps"] = spec.accumulate_steps
        if spec.is_stream:
            _stream_batches(spec, num_steps, state, report)
            return
        listed = spec.steps_records(num_steps, state=state)
    except RecordsNotPlannedError as e:
        report["notes"].append(f"records not listed: {e}")
        return
    if report["resume"] is not None and listed:
        report["resume"]["step"] = listed[0].step
    ids = spec.record_ids()
    for step in listed:
        if len(ids.names) > 1:  # how many records of each set the step holds (a mix's shares)
            counts = Counter(ids.dataset(index) for index, _ in step.batch)
            per_dataset = {name: counts[name] for name in ids.names}
            report["datasets"].append({"step": step.step, "records": per_dataset})
        for rank, micro_batch, pairs in step.slots():
            slot = {"step": step.step, "rank": rank, "micro_batch": micro_batch}
            report["steps"].append({**slot, "record_ids": [ids(index) for index, _ in pairs]})


def _stream_batches(
    spec: TrainDataSpec, num_steps: int, state: dict[str, Any] | None, report: dict[str, Any]
) -> None:
    """List the first steps' batches of rank 0's stream loader, as its workers form them."""
    # The elements as the stream yields them: nothing is mapped.
    loader = TrainLoader(dataclasses.replace(spec, mapper=None))
    if state is not None:
        loader.load_state_dict(state)
    first = 0 if report["resume"] is None else report["resume"]["iteration"] or 0
    workers = spec.loader.num_workers
    report["notes"].append(
        f"stream dataset: rank 0's batches as its {max(1, workers)} loader worker(s) form "
        f"them (DATALOADER.NUM_WORKERS {workers}); each rank reads what its stream gives it"
    )
    batches = iter(loader)
    try:
        for step in range(first, first + num_steps):
            for micro_batch in range(spec.accumulate_steps):
                worker = loader.state_dict()["next_worker"]
                batch = next(batches, None)
                if batch is None:  # a finite stream ended
                    return
                slot = {"step": step, "rank": 0, "micro_batch": micro_batch, "worker": worker}
                report["steps"].append({**slot, "record_ids": [_element_id(e) for e in batch]})
    finally:
        del batches  # its loader workers stop


def _element_id(element: Any) -> str:
    """A stream element's own id (``image_id=...``, ``file_name=...``), else its start."""
    own = record_label(element, "").strip()
    text = repr(element)
    return own or (text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "...")


def _resume_state(
    run: RunConfig, world_size: int, report: dict[str, Any]
) -> tuple[dict[str, Any] | None, int]:
    """The loader position and data seed a resumed job continues with (as resume_or_load)."""
    path = Checkpointer(torch.nn.Module(), run.output_dir, save_to_disk=False)
    newest = path.get_checkpoint_file()
    if not newest:
        report["notes"].append(
            f"--resume: no checkpoint in the output directory {run.output_dir!r}; the run "
            "starts at iteration 0"
        )
        return None, run.data_seed
    # Memory-mapped and dropped: the weights are never read into a model.
    checkpoint = read_unsharded_part(newest, keep_mapped=True)
    state = upgrade_run_state(checkpoint)
    last = state.get("iteration", checkpoint.get("iteration"))
    first = None if last is None else last + 1
    report["resume"] = {"checkpoint": newest, "iteration": first, "step": None}
    run.check_resume(state["world_size"], world_size)
    if last is not None and run.max_iter is not None and last + 1 >= run.max_iter:
        report["notes"].append(
            f"--resume: the checkpoint ends the run (max_iter {run.max_iter}); resuming "
            "trains nothing"
        )
    seed = state["seed"] if run.data_seed < 0 and state["seed"] is not None else run.data_seed
    data = continued_position(state, world_size)
    if data is None:
        report["notes"].append(
            f"--resume: the checkpoint of {state['world_size']} processes holds no position in "
            "the global stream; the data order starts afresh (steps listed from 0)"
        )
    return data, seed


def format_dry_run(report: dict[str, Any], num_gpus: int, num_machines: int) -> str:
    """Return the text ``--dry-run`` prints for :func:`dry_run`'s ``report``."""
    heading = (
        "Recipe (the keys auto-scaling may change, for this job):"
        if report.get("rescaled", True)
        else "Recipe (a LazyConfig is not rescaled to the world size: as written):"
    )
    lines = [
        f"Dry run of a job of {report['world_size']} processes ({num_gpus} per machine x "
        f"{num_machines} machine(s)): nothing is trained and no process is started.",
        "",
        heading,
    ]
    origins = report.get("origins", {})
    width = max([28, *map(len, report["recipe"])])
    for key, value in report["recipe"].items():
        origin = origins.get(key)
        lines.append(f"  {key:<{width}} {value}" + (f"   ({origin})" if origin else ""))
    if report["micro_batch_size"] is not None:
        lines.append(
            f"  each process: {report['accumulate_steps']} micro-batch(es) of "
            f"{report['micro_batch_size']} record(s) per optimizer step"
        )
    lines.append("")
    if report["refused"]:
        lines += [f"Refused: {reason}" for reason in report["refused"]]
    elif report.get("rescaled", True):
        lines.append("Accepted: auto_scale_workers and the train loader's checks pass.")
    else:
        lines.append("Accepted: the train loader's arguments pass its checks.")
    if (resume := report["resume"]) is not None:
        lines.append(
            f"Resume: {resume['checkpoint']}: training continues at iteration "
            f"{resume['iteration']}; the global stream at optimizer step {resume['step']}."
        )
    lines += [f"Note: {note}" for note in report["notes"]]
    if report.get("memory") is not None:
        lines += format_memory(report["memory"], report["world_size"])
    lines += _format_steps(report["steps"], report.get("datasets", []))
    return "\n".join(lines) + "\n"


def _format_steps(steps: list[dict[str, Any]], datasets: list[dict[str, Any]]) -> list[str]:
    if not steps:
        return []
    lines = ["", "Records of the first steps (step, rank, micro-batch: record ids):"]
    per_dataset = {entry["step"]: entry["records"] for entry in datasets}
    for step, slots in itertools.groupby(steps, key=lambda entry: entry["step"]):
        counts = per_dataset.get(step)
        shares = "" if counts is None else ": " + ", ".join(f"{n} {c}" for n, c in counts.items())
        lines.append(f"  step {step}{shares}")
        shown = []
        for slot in slots:
            ids = slot["record_ids"]
            text = ", ".join(ids[:_SHOWN_RECORDS])
            if len(ids) > _SHOWN_RECORDS:
                text += f", ... ({len(ids)} records)"
            worker = f" (loader worker {slot['worker']})" if "worker" in slot else ""
            where = f"rank {slot['rank']}, micro-batch {slot['micro_batch']}{worker}"
            shown.append(f"    {where}: {text}")
        if len(shown) > _SHOWN_SLOTS:  # the first ones and the last
            more = len(shown) - _SHOWN_SLOTS
            shown[_SHOWN_SLOTS - 1 : -1] = [f"    ... {more} more (--dry-run-json FILE lists them)"]
        lines += shown
    return lines


def run_dry_run(cfg: Any, args: argparse.Namespace) -> None:
    """Print the dry run of the job ``args`` describe (and write its JSON); exit.

    The world size is ``--num-gpus`` x ``--num-machines`` (never a running job's). Exits
    with status 0, or 2 when the job would be refused (the report says why).

    Raises:
        UsageError: For a negative ``--dry-run-steps`` or a world size below 1.
        SystemExit: Always, after printing.
    """
    num_steps = int(args.dry_run_steps)
    if num_steps < 0:
        raise UsageError(f"--dry-run-steps must be >= 0, got {num_steps}.")
    num_gpus, num_machines = int(args.num_gpus), int(args.num_machines)
    if num_gpus < 1 or num_machines < 1:
        raise UsageError(
            f"--num-gpus and --num-machines must be at least 1, got {num_gpus} and {num_machines}."
        )
    if "STRAGGLER" in cfg:  # the keys a trainer checks first, before it trains
        check_straggler_config(cfg)
    report = dry_run(
        cfg,
        num_gpus * num_machines,
        resume=bool(args.resume),
        num_steps=num_steps,
        local_size=num_gpus,
        trainers=script_trainers(),
    )
    # Under torchrun every process gets here (launch starts none); one prints.
    if os.environ.get("RANK", "0") == "0":
        print(format_dry_run(report, num_gpus, num_machines), end="", flush=True)  # noqa: T201
        json_file = args.dry_run_json
        if json_file:
            with atomic_write(json_file, "w") as f:
                f.write(json.dumps(report, indent=1) + "\n")
    raise SystemExit(2 if report["refused"] else 0)
