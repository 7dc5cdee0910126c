"""``HistoryBuffer``: the ``(value, iteration)`` series behind each scalar of an ``EventStorage``.

It has the public methods of :class:`fvcore.common.history_buffer.HistoryBuffer` (``update``,
``latest``, ``median``, ``avg``, ``global_avg``, ``values``), so detectron2 code
(``storage.history("loss").avg(20)``) keeps working. It is not fvcore's class because:

- trainers file ``gather_metric_period`` iterations at once (:meth:`HistoryBuffer.extend`);
  fvcore's public API takes one ``update`` per value, and a faster extend would write its
  private fields;
- fvcore's ``median``/``avg`` first convert the window to a NumPy array (~15 us per call, ten
  times sorting a 20-value window in Python), and writers take several per write;
- writers smooth over the last N *iterations* (:meth:`HistoryBuffer.count_recent`), which
  needs the iterations without building ``(value, iteration)`` tuples;
- two flat arrays take 16 bytes a point (a list of tuples ~100), and dropping the oldest
  points is amortised rather than one ``list.pop(0)`` per value once the buffer is full.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence

__all__ = ["HistoryBuffer"]


class HistoryBuffer:
    """The latest ``max_length`` values of one scalar with their iterations, and the mean of all.

    :meth:`median` and :meth:`avg` read the newest values in the order they were added;
    :meth:`global_avg` covers every value ever added, dropped ones included.
    """

    def __init__(self, max_length: int = 1_000_000) -> None:
        """Create an empty buffer.

        Args:
            max_length: the most values kept; older ones are dropped as new ones arrive.

        Raises:
            ValueError: If ``max_length`` is not positive.
        """
        if max_length < 1:
            raise ValueError(f"HistoryBuffer max_length must be at least 1, got {max_length}.")
        self._max_length = max_length
        self._values = array("d")
        self._iterations = array("q")
        # Whether the iterations never decrease, the usual case; windows over iterations are
        # then found by bisection instead of a walk. _newest is the last iteration added.
        self._in_order = True
        self._newest = -(2**63)
        self._count = 0
        self._sum = 0.0
        # Points beyond max_length are dropped in chunks, so that trimming the front of the
        # arrays (a memmove of everything kept) is rare: reads look at the last max_length.
        # _trim_due is the value of _count past which the arrays hold a chunk too many.
        self._chunk = max(16, max_length // 8)
        self._trim_due = max_length + self._chunk

    def update(self, value: float, iteration: int | None = None) -> None:
        """Add one value.

        Args:
            value: the number.
            iteration: the iteration it belongs to; ``None`` numbers values 0, 1, 2, ... in
                the order they were added (as fvcore does).
        """
        # Called for every put_scalar: kept as cheap as fvcore's update.
        value = float(value)
        if iteration is None:
            iteration = self._count
        if iteration < self._newest:
            self._in_order = False
        try:
            self._iterations.append(iteration)
        except TypeError:  # not an int (fvcore allows floats): store it as one
            iteration = int(iteration)
            self._iterations.append(iteration)
        self._newest = iteration
        self._values.append(value)
        self._count += 1
        self._sum += value
        if self._count > self._trim_due:
            self._trim()

    def extend(self, points: Sequence[tuple[float, int]]) -> None:
        """Add ``(value, iteration)`` points, as :meth:`update` for each would, in one go.

        Args:
            points: the points, oldest first.
        """
        if not points:
            return
        new_values = array("d", [value for value, _ in points])
        iterations = [int(cur_iter) for _, cur_iter in points]
        # Sorting an already sorted run is one linear pass in C.
        if self._in_order and (self._newest > iterations[0] or iterations != sorted(iterations)):
            self._in_order = False
        self._values.extend(new_values)
        self._iterations.extend(iterations)
        self._newest = iterations[-1]
        self._count += len(new_values)
        self._sum += math.fsum(new_values)
        if self._count > self._trim_due:
            self._trim()

    def _trim(self) -> None:
        excess = len(self._values) - self._max_length
        del self._values[:excess]
        del self._iterations[:excess]
        self._trim_due = self._count + self._chunk

    def __len__(self) -> int:
        """Number of values kept (at most ``max_length``)."""
        return min(len(self._values), self._max_length)

    def latest(self) -> float:
        """Return the value added last.

        Raises:
            IndexError: If the buffer is empty.
        """
        if not self._values:
            raise IndexError("HistoryBuffer.latest() was called on an empty buffer.")
        return self._values[-1]

    def median(self, window_size: int) -> float:
        """Return the median of the newest ``window_size`` values (NaN if there are none).

        For an even count it is the mean of the middle two values, as ``numpy.median``.
        """
        window = sorted(self._window(window_size))
        if not window:
            return math.nan
        mid = len(window) // 2
        return window[mid] if len(window) % 2 else (window[mid - 1] + window[mid]) / 2.0

    def avg(self, window_size: int) -> float:
        """Return the mean of the newest ``window_size`` values (NaN if there are none)."""
        window = self._window(window_size)
        return math.fsum(window) / len(window) if window else math.nan

    def _window(self, window_size: int) -> array[float]:
        # An empty window for window_size <= 0 (a [-0:] slice would be every value).
        return (
            self._values[-min(window_size, self._max_length) :] if window_size > 0 else array("d")
        )

    def global_avg(self) -> float:
        """Return the mean of every value ever added, dropped ones included (0.0 if none)."""
        return self._sum / self._count if self._count else 0.0

    def values(self) -> list[tuple[float, int]]:
        """Return the kept ``(value, iteration)`` points, oldest first, as a new list."""
        start = max(0, len(self._values) - self._max_length)
        return list(zip(self._values[start:], self._iterations[start:]))

    def count_recent(self, window_size: int) -> int:
        """Return how many of the newest values belong to the last ``window_size`` iterations.

        Counting walks back from the newest value and stops at the first one filed at or
        before ``latest iteration - window_size`` (detectron2's
        ``EventStorage.count_samples``): a metric recorded twice per iteration gets twice the
        values, one recorded every other iteration half as many.

        Args:
            window_size: number of iterations, counted back from the newest value's.
        """
        iterations = self._iterations
        end = len(iterations)
        if not end or window_size <= 0:
            return 0
        start = end - self._max_length if end > self._max_length else 0
        oldest_in_window = self._newest - window_size
        if self._in_order:
            # With one value per iteration the window starts window_size values back; look
            # there first so that a long history costs no more than a short one.
            guess = end - window_size - 1
            if guess > start and iterations[guess] <= oldest_in_window:
                start = guess
            return end - bisect.bisect_right(iterations, oldest_in_window, start, end)
        # Newest first; stop at the first value outside the window.
        count = 0
        for index in range(end - 1, start - 1, -1):
            if iterations[index] <= oldest_in_window:
                break
            count += 1
        return count
