"""The train loader's position: one versioned plain-data format, its checks and its upgrades.

``TrainLoader.state_dict()`` returns and ``load_state_dict()`` takes this format; no other
module reads or writes its keys (the engine asks :func:`is_global_position` only). It holds
numbers, strings, lists and dicts, so it loads with ``torch.load(weights_only=True)``.

Version 3, written today. Every state has ``version``, ``kind`` and what a continuing loader
must match: ``source`` (the sampler's identity: type, seed, dataset size, ...; a
``RankStream``'s seed and shares; or ``None``), ``batch_size`` (records per batch of the plan:
``SOLVER.IMS_PER_BATCH`` for ``"global"``, this rank's (micro-)batch otherwise) and
``num_buckets`` (aspect-ratio buckets, 1 without grouping). By ``kind``:

* ``"global"`` (:class:`~trainkit.data.plans.batch_plan.GlobalBatchPlan`): a position in the global
  stream; taken at an optimizer-step boundary, any world size and ``SOLVER.ACCUMULATE_STEPS``
  continue it. ``position`` (the next global position of the step being composed),
  ``buckets`` (per bucket, the ``[index, global position]`` pairs waiting), ``steps``
  (optimizer steps whose micro-batches this rank returned), ``micro`` (micro-batches of step
  ``steps`` returned), ``split`` (``[world size, ACCUMULATE_STEPS]`` of the job that wrote it).
  A weighted mix of sets (:class:`~trainkit.data.plans.mixed_sampler.MixedBatchPlan`,
  ``DATASETS.TRAIN_WEIGHTS``) has ``position`` = records of the steps composed, ``buckets``
  empty, and ``sets``: per set, ``position`` (the next position of its own stream),
  ``taken`` (records it gave to steps), ``records`` (those of the last step composed) and
  ``buckets``; its ``source`` names every set (``name``, ``size``, ...) and the weights.
* ``"rank"`` (:class:`~trainkit.data.plans.batch_plan.RankBatchPlan`): this rank's draws from its
  own sampler; only the same rank of the same world size continues it. ``rank``, ``world_size``,
  ``num_drawn`` (draws of the current pass), ``pass_offset`` (draws of a finite sampler's finished
  passes: positions go on growing), ``buckets`` (as above) and ``num_batches``.
* ``"stream"`` (:mod:`trainkit.data.loading.stream_batches`): what each loader worker read of a
  stream dataset; only as many loader workers (``DATALOADER.NUM_WORKERS``) continue it.
  ``num_workers``, ``next_worker`` (whose batch comes next) and ``workers``: per worker,
  ``read`` (the elements it read) and ``buckets`` (per bucket, ``[count, position]`` of the
  elements waiting, ``count`` numbering the worker's elements).

:func:`upgrade` reads every older format a checkpoint can hold: version 1 (per rank; with or without
``kind``, ``pass_offset`` and ``last_batch``), version 2 (global), stream states (no version) and
``RankDataLoader``'s version-2 wrapper around a stream state.
"""

from __future__ import annotations

from typing import Any

from trainkit.config import ConfigError

__all__ = [
    "VERSION",
    "check_stream_workers",
    "copy_state",
    "is_global_position",
    "load_state",
    "mixed_set_metrics",
    "new_state",
    "upgrade",
]

VERSION = 3

# Fields that must match for a saved position to mean the same records in this loader.
_IDENTITY = ("source", "batch_size", "num_buckets")
_WHAT = {
    "global": "a position in the global stream (a trainkit training sampler)",
    "rank": "a position of one rank's own sampler",
    "stream": "a position in a stream dataset (an IterableDataset)",
}
_SETTINGS = {
    "global": "SEED, SOLVER.IMS_PER_BATCH, DATALOADER.* settings and datasets",
    "rank": "SOLVER.IMS_PER_BATCH, SOLVER.ACCUMULATE_STEPS and DATALOADER.ASPECT_RATIO_BINS",
    "stream": "dataset (a RankDataset: its seed, mini_epochs and world size), SEED and "
    "DATALOADER.* settings",
}


def new_state(kind: str, **fields: Any) -> dict[str, Any]:
    """Return the state of a loader of ``kind`` that has returned nothing yet.

    Args:
        kind: ``"global"``, ``"rank"`` or ``"stream"``.
        **fields: the identity (``source``, ``batch_size``, ``num_buckets``) and the kind's
            own keys that are not zero at the start (``split``; ``rank``, ``world_size``,
            ``num_drawn``; ``num_workers``).
    """
    empty = [[] for _ in range(fields["num_buckets"])]
    start: dict[str, dict[str, Any]] = {
        "global": {"position": 0, "buckets": empty, "steps": 0, "micro": 0},
        "rank": {"num_drawn": 0, "pass_offset": 0, "buckets": empty, "num_batches": 0},
        "stream": {"next_worker": 0},
    }
    state = {"version": VERSION, "kind": kind, **start[kind], **fields}
    if kind == "stream":
        state["workers"] = [
            {"read": 0, "buckets": [[] for _ in empty]} for _ in range(fields["num_workers"])
        ]
    return state


def is_global_position(state: dict[str, Any] | None) -> bool:
    """Return whether ``state`` is a position in the global stream that any world size continues.

    True for the state of a loader over a trainkit training sampler (today's and version 2);
    False for a per-rank or stream position, for ``None`` and for anything else.
    """
    return isinstance(state, dict) and state.get("kind") == "global" and "position" in state


def mixed_set_metrics(state: dict[str, Any] | None) -> dict[str, float]:
    """Return each mixed set's ``data/<name>/epoch`` and ``data/<name>/records`` after a step.

    ``epoch`` is the set's records given to steps over its size (2.5: half-way through its
    third epoch), ``records`` its records in the last step composed. Empty for any state
    that is not a weighted mix (``DATASETS.TRAIN_WEIGHTS`` empty, ``None``, ...).
    """
    if not isinstance(state, dict) or "sets" not in state:
        return {}
    metrics = {}
    for described, part in zip(state["source"]["sets"], state["sets"]):
        name = described["name"]
        metrics[f"data/{name}/epoch"] = part["taken"] / described["size"]
        metrics[f"data/{name}/records"] = float(part["records"])
    return metrics


def copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """Return a deep copy of ``state`` (nested dicts and lists of plain values)."""
    if isinstance(state, dict):
        return {key: copy_state(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return [copy_state(value) for value in state]
    return state


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """Return ``state`` (of any version this trainkit ever wrote) in today's format, as a copy.

    Raises:
        ConfigError: A ``ValueError``: if ``state`` is not a data loader state of a known version.
    """
    if not isinstance(state, dict):
        raise ConfigError(f"a data loader state is a dict, got {type(state).__name__}")
    state = copy_state(state)
    if "loader" in state:  # RankDataLoader, version 2: its identity around a stream state
        inner = upgrade(state["loader"])
        keys = ("seed", "rank", "world_size", "mini_epochs")
        return {**inner, "source": {"type": "RankStream", **{k: state.get(k) for k in keys}}}
    kind, version = state.get("kind", "rank"), state.get("version")
    if version == VERSION and kind in _WHAT:
        return state
    if kind == "global" and version == 2:
        state.update(source=state.pop("stream"), batch_size=state.pop("global_batch_size"))
    elif kind == "rank" and version == 1:
        sampler = state.pop("sampler", None)
        source = {k: v for k, v in sampler.items() if k != "num_drawn"} if sampler else None
        state.update(source=source, num_buckets=len(state["buckets"]))
        state.setdefault("pass_offset", 0)
        state.pop("last_batch", None)
    elif kind == "stream" and version is None:
        num_workers = state["num_workers"]
        for worker, part in enumerate(state["workers"]):
            # Before version 3 a worker kept [count, bucket] of each waiting element.
            pending = part.pop("pending")
            buckets = [[] for _ in range(1 + max((b for _, b in pending), default=0))]
            for count, bucket in pending:
                buckets[bucket].append([count, count * num_workers + worker])
            part["buckets"] = buckets
        # Not recorded then, so not checked now.
        state.update(source=None, batch_size=None, num_buckets=None)
    else:
        raise ConfigError(
            f"unknown data loader state (version {version!r}, kind {kind!r}); this trainkit "
            f"reads versions 1 to {VERSION}. Resume with the trainkit that wrote it, or start "
            "in a new OUTPUT_DIR."
        )
    state.update(version=VERSION, kind=kind)
    return state


def check_stream_workers(state: dict[str, Any], num_workers: int) -> None:
    """Raise a ``ConfigError`` unless stream position ``state`` was read by ``num_workers``."""
    if state["num_workers"] != num_workers:
        raise ConfigError(
            f"the stream loader's state was saved with {state['num_workers']} loader workers, "
            f"this loader has {num_workers}; resume a stream with the same "
            "DATALOADER.NUM_WORKERS (its batches depend on it)."
        )


def load_state(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Check ``saved`` (any version) against a loader whose state is ``current``; return it.

    The result is ``saved`` upgraded, with the ``split`` of this job for a global position.

    Raises:
        ConfigError: A ``ValueError``: if ``saved`` is another kind of position, belongs to
            another sampler, dataset, batch or set of buckets, or is in the middle of an
            optimizer step and the job's split into processes and micro-batches changed.
        ValueError: For another rank's or world size's per-rank position (each rank loads its own).
    """
    state = upgrade(saved)
    kind = current["kind"]
    if state["kind"] != kind:
        raise ConfigError(
            f"this data loader state is {_WHAT[state['kind']]}, this loader keeps "
            f"{_WHAT[kind]}; resume with the sampler and datasets of the saved run "
            "(DATALOADER.SAMPLER_TRAIN, DATASETS.TRAIN), or start in a new OUTPUT_DIR."
        )
    keys = (("rank", "world_size") if kind == "rank" else ()) + _IDENTITY
    found = {key: state.get(key) for key in keys if state.get(key) is not None}
    expected = {key: current.get(key) for key in found}
    if found != expected:
        mismatch = (
            f"data loader state does not match this loader: saved {found}, this loader is "
            f"{expected}."
        )
        if kind == "rank" and any(found[k] != expected[k] for k in ("rank", "world_size")):
            # Another rank's state (or one of another world size): a bug of the caller.
            raise ValueError(f"{mismatch} Each rank must load the state its own loader saved.")
        raise ConfigError(
            f"{mismatch} Resume with the {_SETTINGS[kind]} of the saved run, or start in a "
            "new OUTPUT_DIR."
        )
    if kind == "global":
        split = list(current["split"])
        if state["micro"] and list(state["split"]) != split:
            raise ConfigError(
                f"the data loader state was saved in the middle of an optimizer step by a job "
                f"of {state['split'][0]} processes x {state['split'][1]} micro-batches "
                f"(SOLVER.ACCUMULATE_STEPS); resume it with that split (this job: {split[0]} "
                f"x {split[1]})."
            )
        state["split"] = split
    state.update({key: current[key] for key in _IDENTITY})  # what an old state did not record
    if kind == "stream":
        # Checked here, when the position is loaded: in the workers it would fail only after
        # they started (and an iterator that fails there can hold them until a full GC).
        check_stream_workers(state, current["num_workers"])
        num_buckets = current["num_buckets"]
        for part in state["workers"]:
            # An upgraded stream state holds as many buckets as it had elements waiting in.
            buckets = part["buckets"]
            if any(buckets[num_buckets:]):
                raise ConfigError(
                    f"the data loader state has elements waiting in {len(buckets)} aspect-ratio "
                    f"buckets, this loader has {num_buckets}; resume with the saved run's "
                    "DATALOADER.ASPECT_RATIO_GROUPING and DATALOADER.ASPECT_RATIO_BINS."
                )
            part["buckets"] = (buckets + [[] for _ in range(num_buckets)])[:num_buckets]
    return state
