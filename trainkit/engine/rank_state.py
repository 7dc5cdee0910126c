"""Every rank's RNG states and data-stream position, as one checkpointable object.

Only rank 0 writes a checkpoint, but a bit-exact resume needs what differs per rank: the
torch/numpy/Python RNG states (dropout, augmentation outside ``sample_rng``) and each rank's
loader position. :class:`RankStates` gathers them on every rank just before a save
(:meth:`~RankStates.capture`, a collective) and is registered with the checkpointer like any
other checkpointable, so the checkpoint holds them and a resume restores each rank's own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainkit.utils import comm
from trainkit.utils.env import get_rng_state, set_rng_state

__all__ = ["RankStates"]

logger = logging.getLogger(__name__)


class RankStates:
    """Gather, save and restore per-rank RNG and data-loader states.

    Args:
        current_iter: returns the trainer's current iteration (to tell a stale capture).
        data_loader: returns the train loader; its ``state_dict`` / ``load_state_dict`` (if
            it has them) are part of each rank's state.
    """

    def __init__(self, current_iter: Callable[[], int], data_loader: Callable[[], Any]) -> None:
        self._current_iter = current_iter
        self._data_loader = data_loader
        self._captured: list[dict[str, Any]] | None = None
        self._captured_iter = -1

    def local_state(self) -> dict[str, Any]:
        """Return this rank's RNG states and loader position (plain data)."""
        loader = self._data_loader()
        data = loader.state_dict() if hasattr(loader, "state_dict") else None
        return {"rng": get_rng_state(), "data": data}

    def capture(self) -> None:
        """Gather every rank's state for the checkpoint about to be written.

        Collective:
            ``all_gather`` over all ranks; every rank calls it before the same save.
        """
        self._captured = comm.all_gather(self.local_state())
        self._captured_iter = self._current_iter()

    def state_dict(self) -> dict[str, Any]:
        """Return every rank's state as captured at this iteration (one process: taken now).

        A capture from another iteration is stale and left out, with a warning: resuming
        from such a checkpoint is not bit-exact.
        """
        world_size = comm.get_world_size()
        if world_size == 1:
            return {"world_size": 1, "ranks": [self.local_state()]}
        if self._captured is None or self._captured_iter != self._current_iter():
            logger.warning(
                "Saving at iteration %d without the other ranks' data and RNG states (call "
                "RankStates.capture() on every rank first); resuming from it is not exact.",
                self._current_iter(),
            )
            return {"world_size": world_size, "ranks": None}
        return {"world_size": world_size, "ranks": self._captured}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's RNG states and loader position.

        On the world size that wrote the checkpoint, each rank gets its own states back (a
        bit-exact resume). On another one the RNG streams start afresh (they are per rank),
        and the loader continues the global stream when its position is global (batches
        composed from the global stream, the same on every rank), else it starts afresh too.
        """
        world_size = comm.get_world_size()
        ranks = state.get("ranks")
        if ranks is not None and state.get("world_size") == world_size:
            mine = ranks[comm.get_rank()]
            if mine["data"] is not None:
                self._data_loader().load_state_dict(mine["data"])
            set_rng_state(mine["rng"])
            return
        data = ranks[0]["data"] if ranks else None
        if isinstance(data, dict) and data.get("kind") == "global":
            self._data_loader().load_state_dict(data)
            logger.warning(
                "The checkpoint was written by %s processes, this job has %d: the data stream "
                "continues where it stopped (step %d), the per-rank random streams (dropout, "
                "anything outside sample_rng/batch_rng) start afresh.",
                state.get("world_size"),
                world_size,
                data["steps"],
            )
            return
        logger.warning(
            "The checkpoint was written by %s processes, this job has %d: the data order and "
            "random streams start afresh, so this resume is not bit-exact.",
            state.get("world_size"),
            world_size,
        )
