"""Reporting: Markdown tables, targets and PASS/MISS verdicts, JSON results, quiet logs.

Every table prints trainkit beside the baseline measured in the same run, then a ``target``
and a ``PASS/MISS`` column (empty on rows that have no target, such as the baselines).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Print a Markdown table (pastes into the README as is)."""
    print(f"\n### {title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(_fmt(v) for v in row) + " |")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_json(path: str, results: dict[str, Any]) -> None:
    """Write ``results`` to ``path`` (indented JSON)."""
    with open(path, "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)


def verdict(measured: float, target: float, *, higher_is_better: bool) -> str:
    """Return ``"PASS"`` if ``measured`` meets ``target`` in the given direction, else "MISS"."""
    ok = measured >= target if higher_is_better else measured <= target
    return "PASS" if ok else "MISS"


def target_text(target: float, *, higher_is_better: bool) -> str:
    """Return ``">= 0.95"`` / ``"<= 1.05"``, the way targets are printed in every table."""
    return f"{'>=' if higher_is_better else '<='} {target:g}"


@contextlib.contextmanager
def log_to_file(path: str, name: str = "trainkit") -> Iterator[None]:
    """Send ``name``'s INFO records to ``path`` (like a run's ``log.txt``), not the console."""
    import logging

    logger = logging.getLogger(name)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s"))
    previous = (logger.level, logger.propagate, logger.handlers[:])
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        handler.close()
        logger.setLevel(previous[0])
        logger.propagate = previous[1]
        logger.handlers = previous[2]


def all_met(checks: list[tuple[float, float, bool]]) -> str:
    """Return ``"PASS"`` if every ``(measured, target, higher_is_better)`` check is met."""
    met = all(verdict(m, t, higher_is_better=h) == "PASS" for m, t, h in checks)
    return "PASS" if met else "MISS"
