"""The run state: everything a ``DefaultTrainer`` checkpoint holds besides the weights."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from trainkit.data.loading.loader import TrainLoader
from trainkit.data.loading.step_batches import ResumableLoader
from trainkit.data.plans.loader_state import is_global_position
from trainkit.engine.trainer_base import TrainerBase
from trainkit.launcher import record_run_id
from trainkit.utils import comm
from trainkit.utils.env import get_rng_state, set_rng_state

__all__ = ["RunState", "continued_position", "upgrade_run_state"]

logger = logging.getLogger(__name__)


class RunState:
    """Save and restore the run state of one training loop.

    The loop's checkpointer saves :meth:`state_dict` as a checkpoint's ``"trainer"`` entry::

        iteration, hooks, stop_reason   the loop's state (TrainerBase.state_dict): the last
                                        finished iteration, each stateful hook's state by name
        _trainer                        the step's state (optimizer, gradient scaler)
        seed                            the data seed: the global stream is keyed by it
        world_size                      the number of processes that wrote the checkpoint
        ranks                           every rank's RNG states and loader position

    Only rank 0 writes a checkpoint, but a bit-exact resume needs each rank's torch, numpy
    and Python RNG states (dropout, augmentation outside ``sample_rng``) and loader position,
    so every rank calls :meth:`prepare_save` right before a save (``PeriodicCheckpointer``
    and ``PreemptionHandler`` do). ``DefaultTrainer.resume_or_load`` shows a resume's order.

    Args:
        loop: the loop whose state it saves (a ``DefaultTrainer``, or a plain ``SimpleTrainer`` as
            in ``tools/lazyconfig_train_net.py``), held weakly as hooks hold theirs; it uses its
            ``state_dict``, ``iter``, ``loader_state_dict()``, ``data_loader`` and ``events``.
        output_dir: where the run's checkpoints go.
        seed: the data seed (default: the seed of the loop's ``TrainLoader``); set
            :attr:`seed` when the loader is rebuilt for another one.
    """

    def __init__(self, loop: TrainerBase, *, output_dir: str, seed: int | None = None) -> None:
        self._loop_ref = weakref.ref(loop)
        self.output_dir = output_dir
        if seed is None and isinstance(loop.data_loader, TrainLoader):
            seed = loop.data_loader.spec.seed
        self.seed = seed
        self._ranks: list[dict[str, Any]] | None = None
        self._ranks_iter = -1

    @property
    def _loop(self) -> Any:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the training loop of this RunState was deleted")
        return loop

    def _local_state(self) -> dict[str, Any]:
        # The position after the batches the step consumed: those drawn ahead are read again.
        return {"rng": get_rng_state(), "data": self._loop.loader_state_dict()}

    def prepare_save(self) -> None:
        """Get ready for the checkpoint about to be written: call it on every rank first.

        Rank 0 records the job's run id beside the checkpoints (a restart then resumes from
        them by itself) and gathers every rank's RNG states and loader position to write.

        Collective:
            ``all_gather`` over all ranks; every rank calls it before the same save.
        """
        loop = self._loop
        if comm.is_main_process():
            record_run_id(self.output_dir)
        with loop.events.during("checkpoint"):
            self._ranks = comm.all_gather(self._local_state())
        self._ranks_iter = loop.iter

    def state_dict(self) -> dict[str, Any]:
        """Return the run state (see the class docstring) as plain data.

        With several processes, ``ranks`` holds what :meth:`prepare_save` gathered at this
        iteration (None, with a warning, when it was not called).
        """
        loop = self._loop
        state = loop.state_dict()
        state["seed"] = self.seed
        state["world_size"] = world_size = comm.get_world_size()
        if world_size == 1:
            state["ranks"] = [self._local_state()]
        elif self._ranks is not None and self._ranks_iter == loop.iter:
            state["ranks"] = self._ranks
        else:
            logger.warning(
                "Saving at iteration %d without the other ranks' data and RNG states (call "
                "RunState.prepare_save() on every rank first); resuming from it is not exact.",
                loop.iter,
            )
            state["ranks"] = None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the loop, the step, the hooks, and this rank's RNG states and loader position.

        On another world size than the checkpoint's, the per-rank RNG streams start afresh and
        the loader continues the global stream if its saved position is a global one.

        Args:
            state: a checkpoint's ``"trainer"`` entry in today's layout (:func:`upgrade_run_state`).
        """
        loop = self._loop
        loop.load_state_dict(state)
        world_size, rank, ranks = comm.get_world_size(), comm.get_rank(), state.get("ranks")
        data = continued_position(state, world_size, rank)
        if data is not None and isinstance(loop.data_loader, ResumableLoader):
            loop.data_loader.load_state_dict(data)
        if ranks is not None and state.get("world_size") == world_size:
            set_rng_state(ranks[rank]["rng"])
            return
        afresh = (
            "the data stream continues where it stopped, the per-rank random streams "
            "(dropout, anything outside sample_rng/batch_rng) start afresh."
            if data is not None
            else "the data order and random streams start afresh, so this resume is not bit-exact."
        )
        logger.warning(
            "The checkpoint was written by %s processes, this job has %d: %s",
            state.get("world_size"),
            world_size,
            afresh,
        )


def continued_position(
    state: dict[str, Any], world_size: int, rank: int = 0
) -> dict[str, Any] | None:
    """Return the loader position rank ``rank`` of a job of ``world_size`` continues from.

    The rank's own position on the checkpoint's world size; on another, rank 0's if it is a position
    in the global stream (any world size continues it); else None (the data order starts afresh).

    Args:
        state: the checkpoint's ``"trainer"`` entry in today's layout (:func:`upgrade_run_state`).
    """
    ranks = state.get("ranks")
    if ranks is not None and state.get("world_size") == world_size:
        return ranks[rank]["data"]
    data = ranks[0]["data"] if ranks else None
    return data if is_global_position(data) else None


def upgrade_run_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Return the checkpoint's ``"trainer"`` entry in today's layout.

    trainkit 0.1 kept the ranks' states in ``"rank_states"`` and named the seed ``"data_seed"``;
    a plain detectron2-style trainer's may have neither (then seed, world size, ranks are ``None``).

    Args:
        checkpoint: what ``Checkpointer.resume_or_load(..., checkpointables=[])`` returned.
    """
    state = dict(checkpoint.get("trainer", {}))
    old_ranks = checkpoint.get("rank_states")
    if "data_seed" in state:
        state["seed"] = state.pop("data_seed")
    if old_ranks is not None and "ranks" not in state:
        state["ranks"] = old_ranks.get("ranks")
        state.setdefault("world_size", old_ranks.get("world_size"))
    for key in ("seed", "world_size", "ranks"):
        state.setdefault(key, None)
    return state
