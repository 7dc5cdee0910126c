"""A clock of the phases a rank goes through, read once per writer period without waiting.

On a GPU each phase change records a CUDA event on the current stream, so a phase lasts
from when the device reached its start to when it reached the next one: the device's time
line, read (``elapsed_time``) only when the period's metrics are synchronised anyway. On the
CPU a phase change reads ``time.perf_counter``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["PhaseClock"]

# Events kept before the completed ones are folded into the totals (a long writer period
# would otherwise hold one event per phase change of every step in it).
_MAX_PENDING_EVENTS = 256


class PhaseClock:
    """Add up the seconds spent in each phase between two :meth:`take` calls.

    Args:
        device: the training device; CUDA events time phases on a ``cuda`` device,
            ``time.perf_counter`` anywhere else.
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
