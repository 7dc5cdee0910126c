"""An exponential moving average of the model's weights, kept by a hook."""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from typing_extensions import override

from trainkit.checkpoint import (
    is_sharded,
    read_checkpoint_file,
    read_sharded_checkpoint,
    shard_like,
    unwrap_model,
)
from trainkit.engine.hook_base import HookBase, HookPriority

__all__ = ["ModelEMA", "load_ema_weights"]

logger = logging.getLogger(__name__)


class ModelEMA(HookBase):
    """Keep ``ema = decay * ema + (1 - decay) * weights`` after every optimizer step.

    The average covers parameters and buffers (BatchNorm statistics), lives on the model's
    device, and uses torch's multi-tensor EMA. At ``HookPriority.HIGH`` (after the step,
    before anything saves or evaluates) a checkpoint holds the average of the same step as
    the weights, so a resume is bit-exact. The averaged weights and update count are its
    checkpoint state (:func:`load_ema_weights` reads them). It does not change what is
    trained: evaluate with :attr:`ema_model` (``MODEL_EMA.USE_FOR_EVAL``).

    Of a sharded model (``MODEL.FSDP``) each process averages its own shards: torch's
    ``AveragedModel`` cannot copy an FSDP module, and a whole copy would not fit. The
    average is then saved sharded with the checkpoint; it has no :attr:`ema_model`.
    """

    priority = HookPriority.HIGH

    def __init__(self, model: nn.Module | None = None, decay: float = 0.999) -> None:
        """Set up the average.

        Args:
            model: the trained model (a DDP wrapper is unwrapped); ``None``: the trainer's
                ``model``, when training starts.
            decay: weight of the old average at each update, in ``[0, 1)``.

        Raises:
            ValueError: If ``decay`` is outside ``[0, 1)``.
        """
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"MODEL_EMA.DECAY must be in [0, 1), got {decay}")
        self.decay = decay
        self._model = model
        self._averaged: AveragedModel | _ShardedAverage | None = None
        self._pending_state: dict[str, Any] | None = None

    @property
    def ema_model(self) -> nn.Module:
        """The averaged copy of the model (in eval use; never trained).

        Raises:
            RuntimeError: If no model was given and training has not started.
        """
        averaged = self._get_averaged()
        if isinstance(averaged, _ShardedAverage):
            raise RuntimeError(
                "The EMA of a sharded model is kept as shards, with no model to evaluate; set "
                "MODEL_EMA.USE_FOR_EVAL False (or MODEL.FSDP.ENABLED False)."
            )
        return averaged.module

    def _source(self) -> nn.Module:
        return unwrap_model(self._model if self._model is not None else self.trainer.model)  # type: ignore[attr-defined]

    def _get_averaged(self) -> AveragedModel | _ShardedAverage:
        if self._averaged is None and is_sharded(self._source()):
            self._averaged = _ShardedAverage(self._source())
        if self._averaged is None:
            # use_buffers: BatchNorm statistics are averaged too, so the EMA model is usable
            # as it is; the multi-tensor update averages every floating tensor in one go.
            self._averaged = AveragedModel(
                self._source(), multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True
            )
            self._averaged.requires_grad_(False)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            if isinstance(self._averaged, _ShardedAverage):
                self._averaged.load(state["model"])
            else:
                self._averaged.module.load_state_dict(state["model"])
            self._averaged.n_averaged.fill_(int(state["num_updates"]))
            if state.get("decay", self.decay) != self.decay:
                logger.warning(
                    "MODEL_EMA.DECAY changed from %s to %s since the checkpoint; continuing the "
                    "saved average with the new decay.",
                    state.get("decay"),
                    self.decay,
                )
        return self._averaged

    @override
    def before_train(self) -> None:
        self._get_averaged()

    @override
    def after_step(self) -> None:
        averaged = self._get_averaged()
        if isinstance(averaged, _ShardedAverage):
            pairs = averaged.pairs(self._source())
        else:
            pairs = _tensor_pairs(averaged.module, self._source())
        _update_average(pairs, averaged.n_averaged, get_ema_multi_avg_fn(self.decay))

    @override
    def state_dict(self) -> dict[str, Any]:
        averaged = self._get_averaged()
        return {
            "decay": self.decay,
            "num_updates": int(averaged.n_averaged.item()),
            "model": averaged.state_dict()
            if isinstance(averaged, _ShardedAverage)
            else averaged.module.state_dict(),
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending_state = state
        if self._averaged is not None or self._model is not None:
            self._get_averaged()  # else the trainer's model is known in before_train


class _ShardedAverage:
    """The average of a sharded model: a copy of this process's shards and buffers, by name."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = {name: t.detach().clone() for name, t in _named_tensors(model)}
        self.n_averaged = torch.tensor(0, dtype=torch.long)

    def pairs(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # The local shards: the average is elementwise, so each process updates its own.
        return [
            (_local(self.tensors[name]), _local(t.detach())) for name, t in _named_tensors(model)
        ]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def load(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.tensors.items():
            tensor.copy_(shard_like(state[name], tensor))


def _tensor_pairs(averaged: nn.Module, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    averaged_tensors = itertools.chain(averaged.parameters(), averaged.buffers())
    model_tensors = itertools.chain(model.parameters(), model.buffers())
    return [(a.detach(), m.detach()) for a, m in zip(averaged_tensors, model_tensors)]


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _update_average(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], n_averaged: torch.Tensor, multi_avg_fn: Any
) -> None:
    """Do ``AveragedModel.update_parameters`` on ``(average, model)`` tensor pairs, with no wait.

    torch's ``update_parameters`` copies its update count (a CPU tensor) to the device at every
    call, a blocking copy; the EMA rule does not use the count, so it is left on the CPU. The
    tensors are grouped by device and dtype as torch groups them: the same update, bit for bit.
    """
    if int(n_averaged) == 0:  # the first update copies (as torch's does)
        for a, m in pairs:
            a.copy_(m)
    else:
        groups: dict[tuple[torch.device, torch.dtype], tuple[list, list]] = {}
        for a, m in pairs:
            group = groups.setdefault((a.device, a.dtype), ([], []))
            group[0].append(a)
            group[1].append(m.to(a.device))
        for averaged_group, model_group in groups.values():
            multi_avg_fn(averaged_group, model_group, n_averaged)
    n_averaged += 1


def load_ema_weights(model: nn.Module, path: str) -> bool:
    """Load the EMA weights saved by :class:`ModelEMA` in checkpoint ``path`` into ``model``.

    Args:
        model: the model to evaluate (a DDP wrapper is unwrapped).
        path: a checkpoint written by a trainer that ran the ``ModelEMA`` hook.

    Returns:
        True if the checkpoint held EMA weights (and they were loaded), else False (the
        model is left as it was; a warning says so).

    Raises:
        trainkit.checkpoint.CheckpointError: If ``path`` is not a readable checkpoint.
    """
    bare = unwrap_model(model)
    if os.path.isdir(path):  # a sharded checkpoint: the average read in the model's layout
        checkpoint = read_sharded_checkpoint(path, bare)
    else:
        checkpoint = read_checkpoint_file(path, trust_pickle=False)
    state = checkpoint.get("trainer", {}).get("hooks", {}).get(ModelEMA.__qualname__)
    if state is None:
        logger.warning("%s holds no EMA weights; evaluating its trained weights instead", path)
        return False
    own = bare.state_dict()
    bare.load_state_dict(
        {k: shard_like(v, own[k]) if k in own else v for k, v in state["model"].items()}
    )
    logger.info("Loaded the EMA weights (%d updates) from %s", state["num_updates"], path)
    return True
