"""The iteration loop: ``HookBase``, ``TrainerBase``, ``SimpleTrainer`` and ``AMPTrainer``.

``TrainerBase`` owns the loop, hook dispatch, the final writer flush and the trainer's
resumable state. ``SimpleTrainer`` implements one optimisation step from small private
pieces; ``AMPTrainer`` overrides only the pieces that differ under mixed precision.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from trainkit.utils import comm
from trainkit.utils.events import EventStorage, get_event_storage
from trainkit.utils.periodic import is_last_iter, is_period_end

__all__ = ["AMPTrainer", "HookBase", "SimpleTrainer", "TrainerBase"]

logger = logging.getLogger(__name__)


class HookBase:
    """Base class of the callbacks a :class:`TrainerBase` runs around each step.

    The trainer calls, in registration order::

        before_train()
        for cur_iter in range(start_iter, max_iter):
            before_step(); [run_step: ... after_backward() ...]; after_step()
        after_train()          # also when training raised
        final_write()          # only hooks that define it, after every hook's after_train

    A hook reads the trainer through :attr:`trainer`, and only the attributes listed in
    :class:`TrainerBase`'s docstring. State that must survive a resume goes in
    :meth:`state_dict`; the trainer saves it under the hook's class ``__qualname__``.
    """

    # A class attribute, so subclasses that skip ``super().__init__()`` (common in detectron2
    # hooks) still have an unset back-reference rather than an AttributeError.
    _trainer_ref: weakref.ref[TrainerBase] | None = None

    @property
    def trainer(self) -> TrainerBase:
        """The trainer this hook is registered with.

        It is held through a weak reference so that hooks never keep a finished trainer (its
        model, optimizer and data loader workers) alive.

        Raises:
            RuntimeError: If the hook was never registered or its trainer was deleted.
        """
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if trainer is None:
            raise RuntimeError(
                f"{type(self).__name__} is not registered with a live trainer; "
                "call trainer.register_hooks([hook]) first."
            )
        return trainer

    @trainer.setter
    def trainer(self, trainer: TrainerBase | None) -> None:
        self._trainer_ref = None if trainer is None else weakref.ref(trainer)

    def before_train(self) -> None:
        """Run once before the first iteration."""

    def after_train(self) -> None:
        """Run once after the last iteration, or after training raised."""

    def before_step(self) -> None:
        """Run before each iteration's ``run_step``."""

    def after_backward(self) -> None:
        """Run after the backward pass and before the optimizer step (e.g. to clip grads)."""

    def after_step(self) -> None:
        """Run after each iteration's ``run_step``."""

    def state_dict(self) -> dict[str, Any]:
        """Return the state to checkpoint; an empty dict (the default) saves nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the default ignores it."""


def _hook_key(hook: HookBase) -> str:
    # The qualified class name is stable across runs and processes, unlike a position in
    # the hook list, which changes whenever someone registers one more hook.
    return type(hook).__qualname__


class TrainerBase:
    """An iteration-based loop with hooks; subclasses implement :meth:`run_step`.

    Hooks may read exactly these attributes, and built-in hooks read nothing else:

    * ``iter``: the current iteration (0-based); after :meth:`train` returns it is
      ``max_iter``.
    * ``start_iter``, ``max_iter``: the arguments of :meth:`train`.
    * ``storage``: the :class:`EventStorage` opened by :meth:`train`.
    * ``model``, ``optimizer``, ``data_loader``: on :class:`SimpleTrainer` and subclasses.
    * ``cfg``, ``scheduler``, ``checkpointer``: on ``DefaultTrainer``.

    This class does not build models, optimizers or data; ``DefaultTrainer`` does that from a
    config, and a plain loop can call the ``build_*`` functions directly.
    """

    def __init__(self) -> None:
        self._hooks: list[HookBase] = []
        self.iter: int = 0
        self.start_iter: int = 0
        self.max_iter: int = 0
        self._storage: EventStorage | None = None
        # Per-step phase -> bound methods of the hooks that override it (see _index_hooks).
        self._phase_callbacks: dict[str, list[Any]] = {phase: [] for phase in _STEP_PHASES}

    @property
    def storage(self) -> EventStorage:
        """The metrics storage of the current (or most recent) :meth:`train` call.

        Raises:
            RuntimeError: If :meth:`train` has not been called yet.
        """
        if self._storage is None:
            raise RuntimeError("trainer.storage exists only once train() has started")
        return self._storage

    @storage.setter
    def storage(self, storage: EventStorage) -> None:
        self._storage = storage

    def register_hooks(self, hooks: Iterable[HookBase | None]) -> None:
        """Append hooks; they run in the order given, after those registered earlier.

        Args:
            hooks: hooks to add; ``None`` entries are skipped so callers can write
                ``[A(), B() if cond else None]``.

        Raises:
            TypeError: If an entry is not a :class:`HookBase`.
            ValueError: If two hooks that keep state would be saved under the same name.
        """
        new_hooks = [h for h in hooks if h is not None]
        for hook in new_hooks:
            if not isinstance(hook, HookBase):
                raise TypeError(f"hooks must be HookBase instances, got {type(hook).__name__}")
        stateful_keys = [_hook_key(h) for h in self._hooks + new_hooks if _keeps_state(h)]
        duplicates = sorted({k for k in stateful_keys if stateful_keys.count(k) > 1})
        if duplicates:
            # Fail at registration, not at the first checkpoint an hour into the run.
            raise ValueError(
                f"Two registered hooks keep state under the same name {duplicates}; their "
                "checkpoints would overwrite each other. Subclass one to give it another name."
            )
        for hook in new_hooks:
            hook.trainer = self
        self._hooks.extend(new_hooks)
        self._index_hooks()

    def _index_hooks(self) -> None:
        # Per-step phases call only hooks that do something in them: with the usual hooks
        # most per-step calls would be HookBase's no-ops, a measurable share of a small
        # model's step.
        self._phase_callbacks = {
            phase: [getattr(hook, phase) for hook in self._hooks if _overrides(hook, phase)]
            for phase in _STEP_PHASES
        }

    def train(self, start_iter: int, max_iter: int) -> None:
        """Run iterations ``start_iter .. max_iter - 1``, calling the hooks around each.

        Args:
            start_iter: the first iteration to run (``last finished + 1`` on resume).
            max_iter: one past the last iteration to run.

        Raises:
            Exception: Whatever a step or hook raised, after it was logged and every hook's
                ``after_train`` ran.
        """
        logger.info("Starting training from iteration %d", start_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        # Again here, in case code edited the hook list after registering.
        self._index_hooks()
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                while self.iter < max_iter:
                    self.before_step()
                    self.run_step()
                    self.after_step()
                    self.iter += 1
            except BaseException:
                logger.exception("Exception during training:")
                # Each hook's failure is logged inside after_train; the original error is
                # the one worth raising.
                with contextlib.suppress(Exception):
                    self.after_train()
                raise
            self.after_train()

    def before_train(self) -> None:
        """Call every hook's ``before_train``."""
        for hook in self._hooks:
            hook.before_train()

    def after_train(self) -> None:
        """Call every hook's ``after_train`` (all of them, even if one raises), then flush writers.

        Raises:
            Exception: The first exception a hook raised, after all hooks ran.
        """
        self.storage.iter = self.iter
        errors: list[Exception] = []
        for hook in self._hooks:
            try:
                hook.after_train()
            except Exception as e:
                logger.exception("%s.after_train failed", type(hook).__name__)
                errors.append(e)
        # Writers get the last word: metrics that a hook registered after the writer puts in
        # its after_train (a final evaluation) would otherwise never reach metrics.json.
        for hook in self._hooks:
            final_write = getattr(hook, "final_write", None)
            if callable(final_write):
                final_write()
        if errors:
            raise errors[0]

    def before_step(self) -> None:
        """Point the storage at the current iteration, then call every hook's ``before_step``."""
        self.storage.iter = self.iter
        for callback in self._phase_callbacks["before_step"]:
            callback()

    def after_backward(self) -> None:
        """Call every hook's ``after_backward``; ``run_step`` calls this."""
        for callback in self._phase_callbacks["after_backward"]:
            callback()

    def after_step(self) -> None:
        """Call every hook's ``after_step``."""
        for callback in self._phase_callbacks["after_step"]:
            callback()

    def run_step(self) -> None:
        """Run one iteration; subclasses implement it."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Return ``{"iteration": last finished iteration, "hooks": {name: state}}``.

        Only hooks with a non-empty state appear, keyed by class ``__qualname__``.

        Raises:
            ValueError: If two hooks with state share a name.
        """
        hook_states: dict[str, Any] = {}
        for hook in self._hooks:
            state = hook.state_dict()
            if not state:
                continue
            key = _hook_key(hook)
            if key in hook_states:
                raise ValueError(f"Two hooks save state under the same name {key!r}")
            hook_states[key] = state
        return {"iteration": self.iter, "hooks": hook_states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the iteration and the state of every registered hook that has one saved.

        A saved hook state with no matching hook, or a stateful hook with nothing saved,
        is logged as a warning and otherwise ignored.
        """
        self.iter = state["iteration"]
        saved = dict(state.get("hooks", {}))
        for hook in self._hooks:
            key = _hook_key(hook)
            if key in saved:
                hook.load_state_dict(saved.pop(key))
            elif _keeps_state(hook):
                logger.warning("No saved state for hook %s; it starts fresh", key)
        if saved:
            logger.warning(
                "Saved state of hooks that are not registered is ignored: %s", sorted(saved)
            )


_STEP_PHASES = ("before_step", "after_backward", "after_step")


def _overrides(hook: HookBase, phase: str) -> bool:
    # A method set on the instance counts too (some code patches hooks that way).
    return phase in vars(hook) or getattr(type(hook), phase) is not getattr(HookBase, phase)


def _keeps_state(hook: HookBase) -> bool:
    return type(hook).state_dict is not HookBase.state_dict


class SimpleTrainer(TrainerBase):
    """One optimizer step per iteration: next batch, forward, backward, metrics, step.

    The model, in training mode, takes a batch and returns a dict of scalar losses (or one
    scalar tensor, recorded as ``total_loss``); their sum is back-propagated.

    Metrics follow detectron2's ``gather_metric_period``: by default only the steps that end
    a period (``(iter + 1) % gather_metric_period == 0``) are recorded, each gathered over
    ranks when it happens. With ``record_every_step=True`` (what ``DefaultTrainer`` uses)
    every step's losses are kept as detached tensors and synchronised in one go (one host
    copy, one gather) at the end of each period and at the last iteration, so a CUDA step
    never waits for the device and ``metrics.json`` still sees every step.

    A non-finite loss raises ``FloatingPointError``. When the loss lives on the CPU it is
    checked every step before the optimizer step (reading a CPU tensor costs nothing). On a
    GPU the check happens when metrics are synchronised: with ``gather_metric_period=1``
    that is still before every optimizer step; with a longer period up to ``period - 1``
    steps may have applied before the error is raised, the price of not syncing every step.

    For gradient clipping write a hook (``after_backward``); for anything else that changes
    the step, subclass and override the step's pieces, not ``run_step``.
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        async_write_metrics: bool = False,
        *,
        record_every_step: bool = False,
    ) -> None:
        """Set up the step.

        Args:
            model: the model; it must stay in training mode during training.
            data_loader: an iterable of batches, normally infinite; iterated lazily and the
                iterator kept across steps.
            optimizer: the optimizer of ``model``'s parameters.
            gather_metric_period: record (and gather over ranks) metrics every this many
                iterations.
            zero_grad_before_forward: clear gradients before the forward pass rather than
                after it (matters only when the forward pass itself reads gradients).
            async_write_metrics: accepted for detectron2 compatibility. Metrics are written
                synchronously: a background gather would interleave with DDP's collectives
                on the same process group, and ``record_every_step`` already keeps the
                synchronisation off the critical path.
            record_every_step: record every step's metrics, synchronised every
                ``gather_metric_period`` steps and at the last one, instead of only the
                steps that end a period.

        Raises:
            ValueError: If ``gather_metric_period`` is not positive.
        """
        super().__init__()
        if gather_metric_period < 1:
            raise ValueError(f"gather_metric_period must be >= 1, got {gather_metric_period}")
        del async_write_metrics
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.gather_metric_period = gather_metric_period
        self.zero_grad_before_forward = zero_grad_before_forward
        self.record_every_step = record_every_step
        self._data_loader_iter_obj: Iterator[Any] | None = None
        self._num_batches_read = 0
        # Steps not yet synchronised: (iteration, metric names, their values as detached
        # scalar tensors or, for CPU losses, floats, data time in s).
        self._metric_buffer: list[_MetricEntry] = []
        # The loss names of the previous step and the metric names derived from them.
        self._loss_keys: tuple[str, ...] = ()
        self._metric_prefix = ""
        self._metric_names: tuple[str, ...] = ()

    @override
    def run_step(self) -> None:
        if not self.model.training:
            raise RuntimeError(
                "The model was switched to eval mode during training; a hook that evaluates "
                "must restore model.train() (inference_on_dataset does)."
            )
        batch, data_time_s = self._next_batch()
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        with self._forward_context():
            loss_dict = self._losses(batch)
        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        total_loss = _sum_losses(loss_dict)
        self._backward(total_loss)
        self.after_backward()
        self._write_metrics(loss_dict, data_time_s, total_loss=total_loss)
        self._optimizer_step()

    @property
    def _data_loader_iter(self) -> Iterator[Any]:
        # Created on first use, not in __init__: starting loader workers is expensive and a
        # trainer built only to evaluate or to load a checkpoint never needs them.
        if self._data_loader_iter_obj is None:
            self._data_loader_iter_obj = iter(self.data_loader)
        return self._data_loader_iter_obj

    def reset_data_loader(self, data_loader_builder: Callable[[], Iterable[Any]]) -> None:
        """Replace the data loader by ``data_loader_builder()``; the next step starts its iterator.

        The old loader (and its workers) is released before the new one is built, so two
        sets of loader workers never run at once.

        Args:
            data_loader_builder: called without arguments, returns the new loader.
        """
        self.close_data_iterator()
        self.data_loader = ()
        self.data_loader = data_loader_builder()

    def close_data_iterator(self) -> None:
        """Drop the data iterator so its loader workers exit now, not at garbage collection.

        The loader's position is kept by the loader itself, so a later step continues after
        the last batch it returned.
        """
        self._data_loader_iter_obj = None

    def _next_batch(self) -> tuple[Any, float]:
        start_s = time.perf_counter()
        try:
            batch = next(self._data_loader_iter)
        except StopIteration:
            raise RuntimeError(
                f"The data loader ran out after {self._num_batches_read} batches at iteration "
                f"{self.iter}; a training loader must be infinite (use TrainingSampler)."
            ) from None
        self._num_batches_read += 1
        return batch, time.perf_counter() - start_s

    def _forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def _losses(self, batch: Any) -> dict[str, torch.Tensor]:
        output = self.model(batch)
        loss_dict = {"total_loss": output} if isinstance(output, torch.Tensor) else output
        if type(loss_dict) is not dict and not isinstance(loss_dict, Mapping):
            raise TypeError(
                "In training mode the model must return a dict of scalar losses or one "
                f"scalar tensor, got {type(output).__name__}"
            )
        if not loss_dict:
            raise ValueError("The model returned an empty loss dict; there is nothing to train")
        for name, loss in loss_dict.items():
            # numel() reads shape metadata only, so this check does not sync the device.
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError(f"Loss {name!r} must be a one-element tensor, got {loss!r}")
        return dict(loss_dict)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _optimizer_step(self) -> None:
        self.optimizer.step()

    def _is_gather_iter(self, cur_iter: int) -> bool:
        if is_period_end(cur_iter, self.gather_metric_period):
            return True
        return self.record_every_step and is_last_iter(cur_iter, self.max_iter)

    def _write_metrics(
        self,
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        prefix: str = "",
        cur_iter: int | None = None,
        *,
        total_loss: torch.Tensor | None = None,
    ) -> None:
        """Record this step's losses, their sum and the data time (see the class docstring).

        Args:
            loss_dict: the model's losses.
            data_time: seconds spent waiting for this step's batch.
            prefix: prepended to ``total_loss`` (detectron2's convention).
            cur_iter: the iteration to file them under (default: the current one).
            total_loss: ``sum(loss_dict.values())`` when the caller has it already.
        """
        cur_iter = self.iter if cur_iter is None else cur_iter
        if total_loss is None:
            total_loss = _sum_losses(loss_dict)
        keys = tuple(loss_dict)
        if keys != self._loss_keys or prefix != self._metric_prefix:
            # A "total_loss" entry from the model is replaced by the sum, as in _sum_losses.
            self._loss_keys, self._metric_prefix = keys, prefix
            self._metric_names = tuple(k for k in keys if k != "total_loss") + (
                f"{prefix}total_loss",
            )
        names = self._metric_names
        is_gather_iter = self._is_gather_iter(cur_iter)
        if total_loss.is_cpu:
            # Reading a CPU tensor waits for no device, so check every step (recorded or not)
            # and never let a non-finite loss reach the optimizer. The sum is non-finite
            # whenever a term is, so checking it covers every term.
            total = total_loss.item()
            if not math.isfinite(total):
                _raise_non_finite(cur_iter, names, _host_values(loss_dict, names, total))
            if not (self.record_every_step or is_gather_iter):
                return
            values: list[Any] = _host_values(loss_dict, names, total)
        elif self.record_every_step or is_gather_iter:
            values = [loss_dict[name].detach() for name in names[:-1]] + [total_loss.detach()]
        else:
            return
        self._metric_buffer.append((cur_iter, names, values, data_time))
        if is_gather_iter:
            buffered, self._metric_buffer = self._metric_buffer, []
            _gather_and_file(buffered, self.storage)

    @staticmethod
    def write_metrics(
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        cur_iter: int,
        prefix: str = "",
    ) -> None:
        """Gather one step's losses over ranks and put their averages into the current storage.

        ``{prefix}total_loss`` is the sum of the averaged losses, ``data_time`` the slowest
        rank's and ``rank_data_time`` this rank's.

        Args:
            loss_dict: scalar losses of this rank.
            data_time: seconds this rank waited for its batch.
            cur_iter: the iteration to file the values under.
            prefix: prepended to ``total_loss``.

        Raises:
            FloatingPointError: On every rank, if an averaged loss is infinite or NaN.

        Collective:
            ``all_gather`` over all ranks; every rank must call it for the same iterations.
        """
        total = _sum_losses(loss_dict).detach().float().item()
        names = tuple(k for k in loss_dict if k != "total_loss") + (f"{prefix}total_loss",)
        entry = (cur_iter, names, _host_values(loss_dict, names, total), data_time)
        _gather_and_file([entry], get_event_storage(), always_check=True)

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["optimizer"] = self.optimizer.state_dict()
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        else:
            logger.warning("The trainer state holds no optimizer state; the optimizer starts fresh")


def _sum_losses(loss_dict: Mapping[str, torch.Tensor]) -> torch.Tensor:
    # A "total_loss" entry next to other losses is not counted twice: the sum replaces it.
    # One loss is its own sum; this also covers a model's single tensor, {"total_loss": t}.
    if len(loss_dict) == 1:
        return next(iter(loss_dict.values()))
    return functools.reduce(operator.add, (v for k, v in loss_dict.items() if k != "total_loss"))


# (iteration, metric names, values as floats or detached device tensors, data time in s)
_MetricEntry = tuple[int, tuple[str, ...], list[Any], float]


def _host_values(
    loss_dict: Mapping[str, torch.Tensor], names: tuple[str, ...], total: float
) -> list[float]:
    # The last name is the total, already read; one loss is its own total: read it once.
    if len(names) == 2 and loss_dict.get(names[0]) is not None and len(loss_dict) == 1:
        return [total, total]
    return [float(loss_dict[name].detach().float().item()) for name in names[:-1]] + [total]


def _gather_and_file(
    buffered: list[_MetricEntry], storage: EventStorage, *, always_check: bool = False
) -> None:
    """Synchronise buffered metrics and put the rank average into ``storage``.

    Collective:
        ``all_gather`` over all ranks (every rank flushes at the same iterations). All ranks
        see every value, so all raise together on a non-finite loss instead of rank 0
        raising while the others wait in the next collective.
    """
    device_values = [
        value.float().reshape(())
        for _, _, values, _ in buffered
        for value in values
        if isinstance(value, torch.Tensor)
    ]
    if device_values:
        # One stacked device-to-host copy instead of one .item() sync per value.
        host_values = iter(torch.stack(device_values).cpu().tolist())
        buffered = [
            (cur_iter, names, [next(host_values) if isinstance(v, torch.Tensor) else v
                               for v in values], data_time_s)
            for cur_iter, names, values, data_time_s in buffered
        ]
    all_ranks = comm.all_gather(buffered)
    # CPU losses of this process were checked at every step; averages and values read
    # from a device only now are checked here.
    check_finite = always_check or bool(device_values) or len(all_ranks) > 1
    # Columns of (value, iteration) points, filed with one storage call per metric.
    series: dict[str, list[tuple[float, int]]] = {"data_time": [], "rank_data_time": []}
    non_finite: tuple[int, tuple[str, ...], list[float]] | None = None
    for position, (cur_iter, names, values, data_time_s) in enumerate(buffered):
        slowest_data_time_s = data_time_s
        if len(all_ranks) > 1:
            per_rank = [rank_buffer[position] for rank_buffer in all_ranks]
            _check_same_loss_names(cur_iter, [entry[1] for entry in per_rank])
            values = [sum(column) / len(per_rank) for column in zip(*(e[2] for e in per_rank))]
            slowest_data_time_s = max(entry[3] for entry in per_rank)
        if check_finite and not all(math.isfinite(v) for v in values):
            non_finite = (cur_iter, names, values)
            break
        series["data_time"].append((slowest_data_time_s, cur_iter))
        series["rank_data_time"].append((data_time_s, cur_iter))
        for name, value in zip(names, values):
            series.setdefault(name, []).append((value, cur_iter))
    for name, points in series.items():
        if points:
            storage.put_scalar_series(name, points)
    if non_finite is not None:
        _raise_non_finite(*non_finite)


def _raise_non_finite(cur_iter: int, names: tuple[str, ...], values: list[float]) -> None:
    raise FloatingPointError(
        f"Loss became infinite or NaN at iteration={cur_iter}! "
        f"loss_dict = {dict(zip(names, values))}"
    )


def _check_same_loss_names(cur_iter: int, names_per_rank: list[tuple[str, ...]]) -> None:
    for rank, names in enumerate(names_per_rank):
        if names != names_per_rank[0]:
            raise RuntimeError(
                f"At iteration {cur_iter} rank 0 returned losses {list(names_per_rank[0])} but "
                f"rank {rank} returned {list(names)}; every rank must return the same loss "
                "names in the same order so that they can be averaged."
            )


def _device_type(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"


class AMPTrainer(SimpleTrainer):
    """:class:`SimpleTrainer` with automatic mixed precision.

    On CUDA the forward pass runs under ``torch.autocast`` in ``precision`` (float16 by
    default) and the loss is scaled by a ``GradScaler``. On the CPU autocast uses bfloat16,
    which has float32's exponent range and so needs no loss scaling; no scaler is used
    unless one is passed. Only the forward context, the backward and the optimizer step
    differ from :class:`SimpleTrainer`.
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        grad_scaler: torch.amp.GradScaler | None = None,
        precision: torch.dtype = torch.float16,
        log_grad_scaler: bool = False,
        async_write_metrics: bool = False,
        *,
        record_every_step: bool = False,
    ) -> None:
        """Set up the step; see :class:`SimpleTrainer` for the shared arguments.

        Args:
            model: the model, already on its device (which picks the autocast device).
            data_loader: see :class:`SimpleTrainer`.
            optimizer: see :class:`SimpleTrainer`.
            gather_metric_period: see :class:`SimpleTrainer`.
            zero_grad_before_forward: see :class:`SimpleTrainer`.
            grad_scaler: the loss scaler; by default a new one on CUDA with float16 and
                none otherwise.
            precision: the autocast dtype on CUDA; the CPU always uses bfloat16.
            log_grad_scaler: record the loss scale as ``[metric]grad_scaler`` whenever
                metrics are synchronised (reading it syncs the device).
            async_write_metrics: see :class:`SimpleTrainer`.
            record_every_step: see :class:`SimpleTrainer`.
        """
        super().__init__(
            model,
            data_loader,
            optimizer,
            gather_metric_period,
            zero_grad_before_forward,
            async_write_metrics,
            record_every_step=record_every_step,
        )
        self._autocast_device = _device_type(model)
        if self._autocast_device == "cpu" and precision != torch.bfloat16:
            logger.info("AMP on the CPU uses bfloat16 instead of %s", precision)
            precision = torch.bfloat16
        self.precision = precision
        if grad_scaler is None and self._autocast_device == "cuda" and precision == torch.float16:
            grad_scaler = torch.amp.GradScaler("cuda")
        self.grad_scaler = grad_scaler
        self.log_grad_scaler = log_grad_scaler

    @override
    def _forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=self._autocast_device, dtype=self.precision)

    @override
    def _backward(self, loss: torch.Tensor) -> None:
        if self.grad_scaler is None:
            super()._backward(loss)
        else:
            self.grad_scaler.scale(loss).backward()

    @override
    def _optimizer_step(self) -> None:
        if self.grad_scaler is None:
            super()._optimizer_step()
            return
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        if self.log_grad_scaler and self._is_gather_iter(self.iter):
            self.storage.put_scalar("[metric]grad_scaler", self.grad_scaler.get_scale())

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.grad_scaler is not None and "grad_scaler" in state:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
