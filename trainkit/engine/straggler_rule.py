"""The rule that names a slow rank from every rank's phase times of one writer period.

Pure arithmetic on plain numbers (no process group), tested with injected timings;
:class:`~trainkit.engine.stragglers.StragglerDetector` feeds it the ranks' figures.

A rank's **own work** is the sum of its times in :data:`OWN_WORK_PHASES` (every phase of a step but
the waits in collectives, where the fast ranks wait for the slow one, so total step times are equal
on every rank and name nobody). A rank is slow in a period when its own work is at least
``1 + margin`` times the median of the *other* ranks' own work; it is named once it has been slow
for ``periods`` writer periods in a row (a period that is fine starts the count again). Against the
median of the others, a rank 1.5x slower than its peers has a ratio of 1.5 for any world size (with
two ranks, the median of both would be their mean and the slow rank only 1.2x it). The phase named
is the own-work phase by which the rank exceeds the others' median of that phase most.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

__all__ = ["OWN_WORK_PHASES", "SlowRank", "StragglerRule", "own_work_s", "slowest_phase"]

OWN_WORK_PHASES = ("data", "forward/backward", "optimizer", "hooks")
"""Phases that count as a rank's own work; ``collective`` (waiting in collectives),
``checkpoint`` and ``eval`` do not (see ``docs/runs_and_metrics.md``, "Slow ranks")."""


@dataclasses.dataclass(frozen=True)
class SlowRank:
    """A rank slower than the others in one period.

    Attributes:
        rank: its global rank.
        ratio: its own work divided by the median of the other ranks' own work.
        phase: the own-work phase by which it exceeds the others the most.
        excess_s: by how many seconds that phase exceeds the others' median of it.
        own_work_s: its own work in seconds.
        others_s: the median of the other ranks' own work in seconds.
        periods_in_a_row: periods it has been slow in a row, this one included.
    """

    rank: int
    ratio: float
    phase: str
    excess_s: float
    own_work_s: float
    others_s: float
    periods_in_a_row: int


def own_work_s(phases_s: Mapping[str, float]) -> float:
    """Return the seconds of ``phases_s`` (phase -> seconds) that are own work."""
    return sum(phases_s.get(phase, 0.0) for phase in OWN_WORK_PHASES)


def slowest_phase(figures: Sequence[Mapping[str, float]], rank: int) -> tuple[str, float]:
    """Return the own-work phase of ``rank`` furthest above the other ranks' median of it.

    Args:
        figures: each rank's seconds per phase.
        rank: the rank to look at (there must be at least one other).

    Returns:
        The phase and its excess in seconds over the other ranks' median.
    """
    others = [phases for r, phases in enumerate(figures) if r != rank]
    excess = {
        phase: figures[rank].get(phase, 0.0)
        - statistics.median(phases.get(phase, 0.0) for phases in others)
        for phase in OWN_WORK_PHASES
    }
    phase = max(OWN_WORK_PHASES, key=lambda p: excess[p])  # ties: the earlier phase
    return phase, excess[phase]


class StragglerRule:
    """Keep, per rank, how many periods in a row it was slow, and name the ranks that stay so.

    Args:
        margin: how much slower than the others' median a rank must be (0.5: 50 %).
        periods: writer periods in a row a rank must be slow to be named.

    Raises:
        ValueError: If ``margin`` is not positive or ``periods`` is below 1.
    """

    def __init__(self, margin: float = 0.5, periods: int = 3) -> None:
        if margin <= 0:
            raise ValueError(f"margin must be > 0, got {margin}")
        if periods < 1:
            raise ValueError(f"periods must be >= 1, got {periods}")
        self.margin = margin
        self.periods = periods
        self._slow_in_a_row: list[int] = []
        self.max_ratio = 1.0
        """The largest ratio of any rank in the latest period (1.0 with one rank)."""

    def update(self, figures: Sequence[Mapping[str, float]]) -> list[SlowRank]:
        """Compare one period's figures and return the ranks named, slowest first.

        Args:
            figures: each rank's seconds per phase in this period (index = rank).

        Returns:
            The ranks slow ``periods`` periods in a row, by decreasing ratio (none under two ranks).
        """
        if len(figures) != len(self._slow_in_a_row):  # the first period, or a new world size
            self._slow_in_a_row = [0] * len(figures)
        self.max_ratio = 1.0
        if len(figures) < 2:
            return []
        own = [own_work_s(phases) for phases in figures]
        # One sort for all ranks: each rank's others' median is read around its position.
        order = sorted(range(len(own)), key=own.__getitem__)
        ascending = [own[rank] for rank in order]
        named = []
        for position, rank in enumerate(order):
            rank_own_s = own[rank]
            others_s = _median_without(ascending, position)
            ratio = rank_own_s / others_s if others_s > 0 else 1.0
            self.max_ratio = max(self.max_ratio, ratio)
            # "At least": a rank exactly 1 + margin times slower, summed in floats, is named.
            is_fine = ratio < 1.0 + self.margin - 1e-9
            in_a_row = self._slow_in_a_row[rank] = 0 if is_fine else self._slow_in_a_row[rank] + 1
            if in_a_row >= self.periods:
                phase, excess_s = slowest_phase(figures, rank)
                named.append(SlowRank(rank, ratio, phase, excess_s, rank_own_s, others_s, in_a_row))
        return sorted(named, key=lambda slow: -slow.ratio)


def _median_without(ascending: Sequence[float], position: int) -> float:
    """The median of ``ascending`` (sorted, at least 2 values) without the one at ``position``."""
    num_others = len(ascending) - 1
    # The two middle others (one twice for an odd count); the i-th smallest of the others is
    # ascending[i] below position, ascending[i + 1] from it.
    low, high = (i if i < position else i + 1 for i in ((num_others - 1) // 2, num_others // 2))
    return (ascending[low] + ascending[high]) / 2
