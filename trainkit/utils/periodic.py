"""The only place the "every N iterations" rule is written."""

from __future__ import annotations

__all__ = ["is_last_iter", "is_period_end"]


def is_period_end(cur_iter: int, period: int) -> bool:
    """Return True if iteration ``cur_iter`` (0-based, just finished) closes a period.

    With ``period=20`` this is True after iterations 19, 39, 59, ...; ``period=0``
    disables periodic work.

    Raises:
        ValueError: If ``period`` is negative.
    """
    if period < 0:
        raise ValueError(f"period must be >= 0, got {period}")
    return period > 0 and (cur_iter + 1) % period == 0


def is_last_iter(cur_iter: int, max_iter: int) -> bool:
    """Return True if ``cur_iter`` (0-based) is the final iteration of ``train(..., max_iter)``."""
    return cur_iter == max_iter - 1
