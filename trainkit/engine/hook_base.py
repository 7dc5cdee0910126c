"""``HookBase``, ``HookPriority``, the ordered dispatch a loop runs hooks by, ``is_time``.

Importable from :mod:`trainkit.engine.train_loop` and :mod:`trainkit.engine.hooks` too.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from trainkit.checkpoint import find_unsafe_value
from trainkit.utils.errors import add_note
from trainkit.utils.events import EventStorage
from trainkit.utils.periodic import is_last_iter, is_period_end

__all__ = [
    "HookBase",
    "HookedLoop",
    "HookDispatch",
    "HookPriority",
    "blamed_on",
    "hook_state_key",
    "keeps_state",
]

logger = logging.getLogger(__name__)


class HookPriority(enum.IntEnum):
    """Where a hook runs relative to others: lower runs first; ties keep registration order.

    ``DefaultTrainer.build_hooks`` says where each built-in hook runs, and why.
    """

    HIGHEST = 0
    HIGH = 25
    NORMAL = 50
    LOW = 75
    LOWEST = 100


class HookedLoop(Protocol):
    """What every hook may read of the loop it is registered with (``TrainerBase``'s surface).

    ``TrainerBase`` lists the rest (``model``, ``optimizer``, ``cfg``, ...); this module names
    only what it reads itself, so it needs no import of the loop's module.
    """

    iter: int
    start_iter: int
    max_iter: int

    @property
    def storage(self) -> EventStorage:
        """The metrics of the current ``train()`` call."""
        ...


class HookBase:
    """Base class of the callbacks a :class:`TrainerBase` runs around each step.

    The trainer calls, in :class:`HookPriority` order::

        before_train()
        for cur_iter in range(start_iter, max_iter):
            before_step(); [run_step: ... after_backward() ...]; after_step()
        after_train()          # also when training raised
        final_write()          # after every hook's after_train (the writers write last)

    ``after_backward`` runs once per optimizer step, after the last micro-batch's backward
    pass and (with a gradient scaler) after unscaling, so it sees the true gradients.

    A hook reads only the attributes of :attr:`trainer` that :class:`TrainerBase` lists. State that
    must survive a resume goes in :meth:`state_dict`, saved under the hook's class ``__qualname__``.
    """

    priority: int = HookPriority.NORMAL
    """When this hook runs relative to the others (see :class:`HookPriority`)."""

    # A class attribute, so subclasses that skip ``super().__init__()`` (common in detectron2
    # hooks) still have an unset back-reference rather than an AttributeError.
    _trainer_ref: weakref.ref[Any] | None = None

    @property
    def trainer(self) -> Any:  # a TrainerBase (the loop imports this module, not back)
        """The trainer this hook is registered with (weakly: a hook never keeps it alive).

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
    def trainer(self, trainer: Any) -> None:
        self._trainer_ref = None if trainer is None else weakref.ref(trainer)

    def before_train(self) -> None:
        """Run once before the first iteration."""

    def after_train(self) -> None:
        """Run once after the last iteration, or after training raised."""

    def before_step(self) -> None:
        """Run before each iteration's ``run_step``."""

    def after_backward(self) -> None:
        """Run once per step after the backward pass(es), before the optimizer step."""

    def after_step(self) -> None:
        """Run after each iteration's ``run_step``."""

    def final_write(self) -> None:
        """Run after every hook's ``after_train`` (writers write and close here)."""

    def state_dict(self) -> dict[str, Any]:
        """Return the state to checkpoint; an empty dict (the default) saves nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the default ignores it."""


def is_time(trainer: HookedLoop, period: int, max_iter: int | None = None) -> bool:
    """The periodic hooks' "is it time?": the step just finished ends a ``period`` or the run."""
    last = trainer.max_iter if max_iter is None else max_iter
    return is_period_end(trainer.iter, period) or is_last_iter(trainer.iter, last)


def hook_state_key(hook: HookBase) -> str:
    """Return the name a hook's state is saved under: its class ``__qualname__``."""
    # The qualified class name is stable across runs and processes, unlike a position in
    # the hook list, which changes whenever someone registers one more hook.
    return type(hook).__qualname__


_STEP_PHASES = ("before_step", "after_backward", "after_step")


def _note_hook(error: BaseException, hook: HookBase, method: str, iteration: int) -> None:
    add_note(error, f"(raised in hook {type(hook).__name__}.{method} at iteration {iteration})")


@contextlib.contextmanager
def blamed_on(hook: HookBase, method: str, iteration: int) -> Iterator[None]:
    """Run the body as ``hook.method``: an exception gets a note naming the hook."""
    try:
        yield
    except Exception as e:
        _note_hook(e, hook, method, iteration)
        raise


def keeps_state(hook: HookBase) -> bool:
    """Return whether ``hook`` defines its own ``state_dict``."""
    return type(hook).state_dict is not HookBase.state_dict


class HookDispatch:
    """The ordered hooks of one loop and, per step phase, the bound methods that act in it.

    Only hooks that override a per-step phase are called in it: most calls would be
    HookBase's no-ops, a measurable share of a small model's step.
    """

    def __init__(self) -> None:
        self.hooks: list[HookBase] = []
        self.callbacks: dict[str, list[tuple[HookBase, Callable[[], None]]]] = {
            p: [] for p in _STEP_PHASES
        }
        self.hook_error: BaseException | None = None  # the last a hook raised in a phase
        self._warned_unsaved: set[tuple[str, str]] = set()

    def add(self, hooks: list[HookBase]) -> None:
        """Insert ``hooks`` by priority (ties keep registration order), reindex the phases."""
        self.hooks = sorted(self.hooks + hooks, key=lambda h: int(h.priority))
        self.callbacks = {phase: [] for phase in _STEP_PHASES}
        for hook in self.hooks:
            methods = {  # by name, without probing the hook for attributes
                "before_step": (hook.before_step, HookBase.before_step),
                "after_backward": (hook.after_backward, HookBase.after_backward),
                "after_step": (hook.after_step, HookBase.after_step),
            }
            for phase, (method, default) in methods.items():
                # Its own method: overridden, or set on the instance.
                if not (isinstance(method, types.MethodType) and method.__func__ is default):
                    self.callbacks[phase].append((hook, method))

    def run(self, phase: str, iteration: int) -> None:
        """Call the hooks acting in ``phase``; what one raises gets a note naming it."""
        for hook, method in self.callbacks[phase]:
            try:
                method()
            except Exception as e:
                _note_hook(e, hook, phase, iteration)
                self.hook_error = e
                raise

    def describe(self) -> list[str]:
        """Return the hooks' class names in the order they run, with non-default priorities."""
        return [
            type(h).__name__
            + ("" if h.priority == HookPriority.NORMAL else f" (priority {int(h.priority)})")
            for h in self.hooks
        ]

    def final_write(self) -> None:
        """Call ``final_write`` on the hooks that have one (the writers), in order."""
        for hook in self.hooks:
            hook.final_write()

    def state_dict(self) -> dict[str, Any]:
        """Return ``{hook_state_key(hook): state}`` of the hooks whose state is not empty.

        Raises:
            ValueError: If two hooks with state share a name.
        """
        states: dict[str, Any] = {}
        for hook in self.hooks:
            state, key = hook.state_dict(), hook_state_key(hook)
            if state and key in states:
                raise ValueError(f"Two hooks save state under the same name {key!r}")
            if state:
                states[key] = self._loadable(key, state)
        return states

    def _loadable(self, key: str, state: dict[str, Any]) -> dict[str, Any]:
        """Return ``state`` without the entries that ``weights_only`` loading cannot read.

        A torch scheduler's ``state_dict`` is its ``__dict__``, so a subclass's helpers (a
        config, an fvcore ``ParamScheduler``) come along; detectron2 pickles them, trainkit's
        checkpoints cannot hold them. They are made again by the hook's constructor on resume,
        so leaving them out (with a warning, once) is what lets such a hook save at all.
        """
        if not isinstance(state, dict):
            return state
        kept = {}
        for name, value in state.items():
            unsafe = find_unsafe_value(value, f"hook {key}'s state[{name!r}]")
            if unsafe is None:
                kept[name] = value
            elif (key, str(name)) not in self._warned_unsaved:
                self._warned_unsaved.add((key, str(name)))
                logger.warning(
                    "Not checkpointed: %s, which torch.load(weights_only=True) cannot read "
                    "back; on resume it keeps what the hook's constructor made. Store tensors "
                    "and plain containers to have it saved.",
                    unsafe,
                )
        return kept

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Give each hook its saved state; log hooks without one and states without a hook."""
        saved = dict(saved)
        for hook in self.hooks:
            key = hook_state_key(hook)
            if key in saved:
                hook.load_state_dict(saved.pop(key))
            elif keeps_state(hook):
                logger.warning("No saved state for hook %s; it starts fresh", key)
        if saved:
            logger.warning(
                "Saved state of hooks that are not registered is ignored: %s", sorted(saved)
            )
