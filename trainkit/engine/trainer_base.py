"""The iteration loop: ``TrainerBase`` runs iterations and calls the hooks around each."""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from trainkit.engine.events import StepEvents
from trainkit.engine.hook_base import HookBase, HookDispatch, blamed_on, hook_state_key, keeps_state
from trainkit.utils.errors import UsageError
from trainkit.utils.events import EventStorage

__all__ = ["TrainerBase"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class _Progress:
    """Where the loop is; shared by a loop and the step trainer bound to it."""

    __slots__ = ("iter", "max_iter", "start_iter", "step_error", "stop_reason", "storage")

    def __init__(self) -> None:
        self.iter = self.start_iter = 0
        self.max_iter: int | None = None  # set by train(), or by hand before it
        self.storage: EventStorage | None = None
        self.stop_reason: str | None = None  # set by request_stop, or a stopped run's state
        self.step_error: BaseException | None = None  # what run_step raised, if it did


class _ProgressField(Generic[_T]):
    """A trainer attribute kept in its ``_progress``, which a bound step trainer shares."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name, self._read = name, operator.attrgetter(name)

    def __get__(self, trainer: TrainerBase | None, owner: type | None = None) -> _T:
        if trainer is None:  # looked up on the class
            return self  # type: ignore[return-value]
        return self._read(trainer._progress)

    def __set__(self, trainer: TrainerBase, value: _T) -> None:
        setattr(trainer._progress, self._name, value)


class TrainerBase:
    """An iteration-based loop with hooks; subclasses implement :meth:`run_step`.

    Hooks read only these attributes (built-in ones included):

    * ``iter``: the current iteration (0-based); after :meth:`train` returns it is ``max_iter``.
    * ``start_iter``, ``max_iter``: the arguments of the current (or last) :meth:`train`.
    * ``storage``: the :class:`EventStorage` opened by :meth:`train`.
    * ``model``, ``optimizer``, ``data_loader``: on ``SimpleTrainer`` and subclasses.
    * ``cfg``, ``scheduler``, ``checkpointer``: on ``DefaultTrainer``.
    * ``events``: the loop's :class:`~trainkit.engine.events.StepEvents` (subscribe to it).

    and call only :meth:`request_stop` (and read :attr:`stop_reason`), and, before they
    write a checkpoint, :meth:`flush_pending_checks`.
    """

    iter: _ProgressField[int] = _ProgressField()
    start_iter: _ProgressField[int] = _ProgressField()
    max_iter: _ProgressField[int] = _ProgressField()

    def __init__(self) -> None:
        self._dispatch = HookDispatch()
        self._progress = _Progress()
        self.events = StepEvents(self._progress)
        self._is_bound = False  # see bind_to

    @property
    def storage(self) -> EventStorage:
        """The metrics storage of the current (or most recent) :meth:`train` call.

        Raises:
            RuntimeError: If :meth:`train` has not been called yet.
        """
        if self._progress.storage is None:
            raise RuntimeError("trainer.storage exists only once train() has started")
        return self._progress.storage

    @storage.setter
    def storage(self, storage: EventStorage) -> None:
        self._progress.storage = storage

    def bind_to(self, loop: TrainerBase) -> None:
        """Run as ``loop``'s step: share its position, storage and hooks from now on.

        ``DefaultTrainer`` binds its step trainer when set; the loop saves the shared state
        (:meth:`state_dict`). Its event listeners join the loop's, replacing an earlier step's.

        Raises:
            ValueError: If this trainer has hooks of its own: the loop's would replace them.
        """
        if self._dispatch.hooks and self._dispatch is not loop._dispatch:
            names = [type(h).__name__ for h in self._dispatch.hooks]
            raise ValueError(
                f"{type(self).__name__} has its own hooks {names}; register them with the "
                f"{type(loop).__name__} it runs inside instead."
            )
        self._dispatch = loop._dispatch
        self._progress = loop._progress
        loop.events.bind_step(self.events.step_listeners)
        self.events = loop.events
        self._is_bound = True

    # ---- hooks ----------------------------------------------------------------------------
    @property
    def hooks(self) -> list[HookBase]:
        """The registered hooks in the order they run (a copy)."""
        return list(self._dispatch.hooks)

    @property
    def _hooks(self) -> list[HookBase]:
        # detectron2 code reads trainer._hooks; it is the live, ordered list.
        return self._dispatch.hooks

    def register_hooks(self, hooks: Iterable[HookBase | None]) -> None:
        """Add hooks; they run by :attr:`HookBase.priority`, then in registration order.

        Args:
            hooks: ``None`` entries are skipped: callers may write ``[A(), B() if cond else None]``.

        Raises:
            TypeError: If an entry is not a :class:`HookBase`.
            ValueError: If two hooks that keep state would be saved under the same name.
        """
        new_hooks = [h for h in hooks if h is not None]
        for hook in new_hooks:
            if not isinstance(hook, HookBase):
                raise TypeError(f"hooks must be HookBase instances, got {type(hook).__name__}")
        keys = [hook_state_key(h) for h in self._dispatch.hooks + new_hooks if keeps_state(h)]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            # Fail at registration, not at the first checkpoint an hour into the run.
            raise ValueError(
                f"Two registered hooks keep state under the same name {duplicates}; their "
                "checkpoints would overwrite each other. Subclass one to give it another name."
            )
        for hook in new_hooks:
            hook.trainer = self
        self._dispatch.add(new_hooks)

    # ---- the loop -------------------------------------------------------------------------
    def train(self, start_iter: int, max_iter: int) -> None:
        """Run iterations ``start_iter .. max_iter - 1``, calling the hooks around each.

        A hook may end the loop early (:meth:`request_stop`). A trainer whose state comes from a
        stopped run (:meth:`load_state_dict`) does not train: it logs why and returns. The loop
        announces phase ``hooks`` on :attr:`events` after each step; a hook's exception carries a
        note naming it, the step's is kept as its failure (``DefaultTrainer`` captures it).

        Args:
            start_iter: the first iteration to run (``last finished + 1`` on resume).
            max_iter: one past the last iteration to run.

        Raises:
            Exception: What a step or hook raised, once logged and every hook's ``after_train`` ran.
        """
        if self._progress.stop_reason is not None:
            logger.warning(
                "Not training: this run stopped early after iteration %d (%s) and stays "
                "stopped when resumed. To train on, start a new run from its weights (e.g. "
                "MODEL.WEIGHTS set to its final checkpoint, in another OUTPUT_DIR).",
                self.iter,
                self._progress.stop_reason,
            )
            # The writers were opened with the hooks; close them so trackers end their runs. An
            # empty storage at max_iter, where the console printer is silent: nothing is written.
            with EventStorage(max_iter) as self.storage:
                self._dispatch.final_write()
            return
        logger.info("Starting training from iteration %d", start_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        self._progress.step_error = None
        # Again here, in case code edited the hook list (or a hook's priority) in between.
        self._dispatch.add([])
        if self._dispatch.hooks:
            logger.info("Hooks, in the order they run: %s", ", ".join(self._dispatch.describe()))
        self._check_before_train()
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                while self.iter < max_iter:
                    self.before_step()
                    try:
                        self.run_step()
                    except BaseException as e:  # an after_backward hook's is the hook's
                        self._progress.step_error = None if e is self._dispatch.hook_error else e
                        raise
                    self.events.phase("hooks")
                    self.after_step()
                    if self._stop_requested_here():
                        self._end_early()
                        break
                    self.iter += 1
            except BaseException as e:
                self._progress.stop_reason = None  # a failure, not a graceful stop
                if isinstance(e, UsageError):
                    # The user's input, not a crash: the message says what to fix.
                    logger.error("Training stopped: %s", e)
                else:
                    logger.exception("Exception during training:")
                # after_train logs each hook's failure; the original error is the one to raise.
                with contextlib.suppress(Exception):
                    self.after_train()
                raise
            self.after_train()

    # ---- stopping early -------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the loop to end gracefully after the current step; hooks call this.

        The step's other ``after_step`` hooks still run; the loop then ends with ``iter`` on
        that step (``iter < max_iter`` tells ``after_train`` hooks the run did not complete),
        and ``after_train`` and the writers' final write run as usual. The first reason wins;
        a request in the last iteration changes nothing. Every rank must request it after the
        same step, else the others wait in their next collective.

        Args:
            reason: why, in a few words; logged and saved in the checkpoint.
        """
        if self._progress.stop_reason is not None:
            logger.debug("Stop already requested (%s); ignoring: %s", self.stop_reason, reason)
            return
        logger.info("Stop requested after iteration %d: %s", self.iter, reason)
        self._progress.stop_reason = str(reason)

    @property
    def step_error(self) -> BaseException | None:
        """What ``run_step`` raised in the current (or last) :meth:`train`, if it raised."""
        return self._progress.step_error

    @property
    def stop_reason(self) -> str | None:
        """Why training stops early (from the request on); ``None`` if it does not (or failed)."""
        return self._progress.stop_reason

    def _stop_requested_here(self) -> bool:
        reason = self._progress.stop_reason
        if reason is None:
            return False
        if self.iter >= self.max_iter - 1:
            logger.info("The stop was requested at the last iteration; the run completes.")
            self._progress.stop_reason = None
            return False
        logger.warning(
            "Training stopped early after iteration %d of %d: %s", self.iter, self.max_iter, reason
        )
        return True

    def flush_pending_checks(self, *, collective: bool = True) -> None:
        """Raise now for a step whose check was deferred (nothing here); call before saving.

        ``collective``: every rank calls it at this step (see the step trainer's). Step trainers
        that check losses on the device override it (:meth:`SimpleTrainer.flush_pending_checks`).
        """

    def loader_state_dict(self) -> dict[str, Any] | None:
        """Return the train loader's position after the batches consumed (``None``: none).

        What a checkpoint saves for each rank; step trainers that draw batches override it.
        """
        return None

    def _end_early(self) -> None:
        """At a :meth:`request_stop`, before ``after_train``: finish what the step deferred.

        Called on every rank; step trainers that buffer metrics override it.
        """

    def before_train(self) -> None:
        """Call every hook's ``before_train``."""
        for hook in self._dispatch.hooks:
            with blamed_on(hook, "before_train", self.iter):
                hook.before_train()

    def after_train(self) -> None:
        """Call every hook's ``after_train`` (all of them, even if one raises), then flush writers.

        Raises:
            Exception: The first exception a hook raised, after all hooks ran.
        """
        self.storage.iter = self.iter
        errors: list[Exception] = []
        for hook in self._dispatch.hooks:
            try:
                with blamed_on(hook, "after_train", self.iter):
                    hook.after_train()
            except Exception as e:
                logger.exception("%s.after_train failed", type(hook).__name__)
                errors.append(e)
        # Writers get the last word: metrics that a hook registered after the writer puts in
        # its after_train (a final evaluation) would otherwise never reach metrics.json.
        self._dispatch.final_write()
        if errors:
            raise errors[0]

    def before_step(self) -> None:
        """Point the storage at the current iteration, then call every hook's ``before_step``."""
        self.storage.iter = self.iter
        self._dispatch.run("before_step", self._progress.iter)

    def after_backward(self) -> None:
        """Call every hook's ``after_backward``; ``run_step`` calls this once per step."""
        self._dispatch.run("after_backward", self._progress.iter)

    def after_step(self) -> None:
        """Call every hook's ``after_step``."""
        self._dispatch.run("after_step", self._progress.iter)

    def run_step(self) -> None:
        """Run one iteration; subclasses implement it."""
        raise NotImplementedError

    # ---- resumable state ------------------------------------------------------------------
    def _check_before_train(self) -> None:
        """Refuse, before any hook runs, a set-up that would fail or hang mid-run (a seam)."""

    def state_dict(self) -> dict[str, Any]:
        """Return ``{"iteration": last finished iteration, "hooks": {name: state}}``.

        Hooks with a non-empty state appear, by class ``__qualname__``; after a stop,
        ``"stop_reason"`` too. A bound trainer (:meth:`bind_to`) returns ``{}``: its loop saves.

        Raises:
            ValueError: If two hooks with state share a name.
        """
        if self._is_bound:
            return {}
        state: dict[str, Any] = {"iteration": self.iter, "hooks": self._dispatch.state_dict()}
        if self._progress.stop_reason is not None:
            state["stop_reason"] = self._progress.stop_reason
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the iteration, the stop request and every registered hook's saved state.

        A stopped run stays so (:meth:`train` does not train). A saved state without a hook, or a
        stateful hook without a state, is logged and ignored. A bound trainer leaves it to its loop.
        """
        if self._is_bound:
            return
        self.iter = state["iteration"]
        self._progress.stop_reason = state.get("stop_reason")
        self._dispatch.load_state_dict(state.get("hooks", {}))
