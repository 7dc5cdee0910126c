"""Slow ranks named: every rank's phase times compared at each writer period.

A rank named goes to the log on rank 0 and to the metrics as ``straggler/*``. The rule
(:class:`~trainkit.engine.straggler_rule.StragglerRule`) and what "own work" holds are
documented in ``docs/runs_and_metrics.md`` ("Slow ranks").
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from typing import Any

import torch
from typing_extensions import override

from trainkit.config import CfgNode, ConfigError
from trainkit.engine.events import StepListener
from trainkit.engine.straggler_rule import SlowRank, StragglerRule
from trainkit.utils import comm
from trainkit.utils.event_storage import EventStorage

__all__ = ["PhaseClock", "StragglerDetector", "build_straggler_detector", "check_straggler_config"]

logger = logging.getLogger(__name__)

# Events kept before the completed ones are folded into the totals (else a long writer
# period holds one event per phase change of every step in it).
_MAX_PENDING_EVENTS = 256


class PhaseClock:
    """Add up the seconds spent in each phase between two :meth:`take` calls.

    Args:
        device: the training device: CUDA events time a ``cuda`` one, ``time.perf_counter`` others.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.uses_cuda_events = device is not None and torch.device(device).type == "cuda"
        self._totals_s: dict[str, float] = {}
        # CPU: (phase, its start in seconds); CUDA: (phase, its start event), oldest first.
        self._marks: list[tuple[str, Any]] = []
        self._free_events: list[torch.cuda.Event] = []

    def enter(self, phase: str) -> None:
        """Start ``phase`` now (no wait: a timestamp, or an event recorded on the stream)."""
        if not self.uses_cuda_events:
            now_s = time.perf_counter()
            if self._marks:
                previous, start_s = self._marks[0]
                self._totals_s[previous] = self._totals_s.get(previous, 0.0) + now_s - start_s
            self._marks = [(phase, now_s)]
            return
        event = (
            self._free_events.pop() if self._free_events else torch.cuda.Event(enable_timing=True)
        )
        event.record()
        self._marks.append((phase, event))
        if len(self._marks) > _MAX_PENDING_EVENTS:
            self._fold(wait=False)

    def take(self) -> dict[str, float]:
        """Return the seconds per phase since the last call; the current phase goes on.

        With CUDA events it waits for the device to reach the current phase's start: call
        it where the step waits for the device anyway (the writer period's metrics).
        """
        if self.uses_cuda_events:
            self._fold(wait=True)
        elif self._marks:
            self.enter(self._marks[0][0])  # split the current phase at now
        totals, self._totals_s = self._totals_s, {}
        return totals

    def _fold(self, *, wait: bool) -> None:
        # Move the phases whose end the device has reached into the totals.
        marks = self._marks
        if wait and marks:
            marks[-1][1].synchronize()
        num_done = 0
        while num_done + 1 < len(marks) and (wait or marks[num_done + 1][1].query()):
            (phase, start), (_, end) = marks[num_done], marks[num_done + 1]
            self._totals_s[phase] = self._totals_s.get(phase, 0.0) + start.elapsed_time(end) / 1e3
            num_done += 1
        self._free_events.extend(event for _, event in marks[:num_done])
        del marks[:num_done]


# The documented rule's limits: a config may be stricter (smaller, fewer), never looser.
_MAX_MARGIN = 0.5
_MAX_PERIODS = 3


class StragglerDetector(StepListener):
    """Time this rank's phases and compare every rank's at each writer period.

    A listener of the loop's events (``DefaultTrainer`` subscribes it): each phase change goes
    to its :class:`PhaseClock`; :meth:`period_figures` rides on each period's metrics (their
    one ``all_gather``) and every rank's reach :meth:`compare_figures`. The first period is a
    warm-up (allocation, loader workers starting, autotuning differ between ranks) and is not
    compared. It cannot see a slow rank whose slowness is all in a collective (a slow network
    link) or in a checkpoint or an evaluation; see ``docs/runs_and_metrics.md``.

    Args:
        rule: the rule applied to each period's figures.
        rank: this process's global rank (rank 0 logs).
        local_rank: its rank within its machine.
        host: its machine's name.
        device: the training device (CUDA events time phases on a GPU).
    """

    def __init__(
        self,
        rule: StragglerRule,
        *,
        rank: int,
        local_rank: int,
        host: str,
        device: torch.device | str | None = None,
    ) -> None:
        self.rule = rule
        self.clock = PhaseClock(device)
        self._rank = rank
        self._where = {"host": host, "local_rank": local_rank}
        self._last_iter: int | None = None

    @override
    def on_phase(self, phase: str, iteration: int) -> None:
        """Note that this rank starts ``phase``."""
        self.clock.enter(phase)

    @override
    def period_figures(self, cur_iter: int) -> dict[str, Any] | None:
        """Return this rank's seconds per step in each phase since the previous period.

        Called at the same point of the same step on every rank, so each rank's figures
        cover the same steps. ``None`` for the first period (the warm-up).

        Args:
            cur_iter: the step whose metrics are being synchronised.
        """
        phases_s = self.clock.take()
        last_iter, self._last_iter = self._last_iter, cur_iter
        if last_iter is None:
            return None
        num_steps = max(cur_iter - last_iter, 1)
        per_step_s = {phase: seconds / num_steps for phase, seconds in phases_s.items()}
        return {**self._where, "phases_s": per_step_s}

    @override
    def compare_figures(  # type: ignore[override]  # returns the ranks named
        self, per_rank: list[dict[str, Any] | None], storage: EventStorage
    ) -> list[SlowRank]:
        """Apply the rule to every rank's figures; record ``straggler/*``, log on rank 0.

        Args:
            per_rank: what :meth:`period_figures` returned on each rank (index = rank).
            storage: where the period's metrics go.

        Returns:
            The ranks named in this period, slowest first.
        """
        if not per_rank or any(figures is None for figures in per_rank):
            return []
        named = self.rule.update([figures["phases_s"] for figures in per_rank])
        scalars = {"straggler/count": len(named), "straggler/ratio": self.rule.max_ratio}
        if named:
            scalars["straggler/rank"] = named[0].rank
            scalars[f"straggler/phase/{named[0].phase}"] = named[0].excess_s
        storage.put_scalars(**scalars, smoothing_hint=False)
        if self._rank == 0:
            for slow in named:
                logger.warning(
                    "Slow rank: rank %(rank)d (host %(host)s, local rank %(local_rank)d) did "
                    "%(ratio).2fx the own work of the other ranks' median (%(own_work_s).4f s "
                    "vs %(others_s).4f s per step) for %(periods_in_a_row)d writer periods in a "
                    "row; its slow phase is '%(phase)s' (+%(excess_s).4f s per step). The other "
                    "ranks wait for it in collectives.",
                    {**dataclasses.asdict(slow), **per_rank[slow.rank]},
                )
        return named


def check_straggler_config(cfg: CfgNode) -> None:
    """Refuse ``STRAGGLER.MARGIN`` / ``STRAGGLER.PERIODS`` looser than the documented rule.

    Raises:
        ConfigError: If either is looser than the rule or not positive.
    """
    margin, periods = cfg.STRAGGLER.MARGIN, cfg.STRAGGLER.PERIODS
    if not 0 < margin <= _MAX_MARGIN:
        raise ConfigError(
            f"STRAGGLER.MARGIN must be in (0, {_MAX_MARGIN}], got {margin}; a rank is named "
            f"when at least 1 + MARGIN times slower, and the rule allows at most {_MAX_MARGIN}."
        )
    if not 1 <= periods <= _MAX_PERIODS:
        raise ConfigError(
            f"STRAGGLER.PERIODS must be in 1..{_MAX_PERIODS}, got {periods}; it is how many "
            f"writer periods in a row a rank must be slow to be named."
        )


def build_straggler_detector(cfg: CfgNode, device: torch.device | None) -> StragglerDetector | None:
    """Return the detector ``STRAGGLER.*`` asks for, or ``None`` (disabled, or one process).

    Raises:
        ConfigError: As :func:`check_straggler_config`.
    """
    check_straggler_config(cfg)
    if not cfg.STRAGGLER.ENABLED or comm.get_world_size() < 2:
        return None
    return StragglerDetector(
        StragglerRule(cfg.STRAGGLER.MARGIN, cfg.STRAGGLER.PERIODS),
        rank=comm.get_rank(),
        local_rank=comm.get_local_rank(),
        host=socket.gethostname(),
        device=device,
    )
