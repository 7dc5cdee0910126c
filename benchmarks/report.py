"""Reporting: Markdown tables, targets and PASS/MISS verdicts, JSON results, quiet logs.

Every table prints trainkit beside the baseline measured in the same run, then a ``target``
and a ``PASS/MISS`` column (empty on rows that have no target, such as the baselines).

With ``--write-docs`` the runner also puts each task's tables, as printed, into
``docs/performance.md``: one section per task, between ``<!-- BEGIN benchmark TASK -->`` and
``<!-- END benchmark TASK -->`` lines inside the page's results region. A task that runs
replaces its own section; the other sections and every line outside the region (the
hand-written explanations) stay as they are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from trainkit.utils.file_io import atomic_write


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


# ---- the performance page (--write-docs) ---------------------------------------------------
RESULTS_BEGIN = "<!-- BEGIN benchmark results: written by tools/benchmark.py --write-docs -->"
RESULTS_END = "<!-- END benchmark results -->"
_RESULTS_NOTE = (
    "<!-- Each section below is replaced when its task runs with --write-docs; edit the page\n"
    "     outside BEGIN/END benchmark results only. -->"
)
_SECTION = re.compile(r"<!-- BEGIN benchmark (\w+) -->\n.*?<!-- END benchmark \1 -->\n", re.S)
# The collect_env rows that say which machine the figures come from.
_MACHINE_ROWS = ("Platform", "CPU count", "PyTorch", "PyTorch build", "Python", "trainkit git SHA")


class _Tee(io.TextIOBase):
    """A text stream that writes to two others (the console, and a copy to read back)."""

    def __init__(self, first: IO[str], second: IO[str]) -> None:
        self._streams = (first, second)

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


@contextlib.contextmanager
def tee_stdout() -> Iterator[io.StringIO]:
    """Print as usual, and keep a copy of what this process prints in the yielded buffer."""
    copy = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, copy)):
        yield copy


def printed_tables(printed: str) -> list[tuple[str, list[str]]]:
    """Return ``(title, table lines)`` of every table :func:`print_table` printed in ``printed``."""
    tables: list[tuple[str, list[str]]] = []
    for line in printed.splitlines():
        if line.startswith("### "):
            tables.append((line[4:], []))
        elif line.startswith("|") and tables:
            tables[-1][1].append(line)
    return [(title, lines) for title, lines in tables if lines]


def machine_summary(rows: Sequence[tuple[str, str]]) -> str:
    """Return one line naming the machine, from ``collect_env_info()`` rows."""
    found = dict(rows)
    parts = [
        found.get("Platform", "unknown platform"),
        f"{found.get('CPU count', '?')} CPUs",
        *(value for key, value in rows if key.startswith("GPU ")),
        f"torch {found.get('PyTorch', '?').split(' @ ')[0]} ({found.get('PyTorch build', '?')})",
        f"Python {found.get('Python', '?').split()[0]}",
        f"trainkit {found.get('trainkit git SHA', '?')}",
    ]
    return ", ".join(parts)


def task_section(
    task: str, printed: str, *, command: str, date: str, seconds: float, machine: str
) -> str:
    """Return the page section of one task: how and where it ran, then its tables."""
    lines = [
        f"<!-- BEGIN benchmark {task} -->",
        f"### `{task}`",
        "",
        f"`{command}`, {date}, {seconds:.0f} s. Machine: {machine}.",
    ]
    for title, table in printed_tables(printed):
        lines += ["", f"**{title}**", "", *table]
    lines += ["", f"<!-- END benchmark {task} -->", ""]
    return "\n".join(lines)


def update_performance_page(path: str, sections: Mapping[str, str], order: Sequence[str]) -> None:
    """Put ``sections`` (task -> :func:`task_section`) into the page at ``path``.

    Each task's section replaces the one already there; the other sections are kept, and
    all are ordered as ``order`` lists the tasks. Text outside the results region is kept
    byte for byte. A page without the region (or no page) gets one at its end.
    """
    text = open(path).read() if os.path.exists(path) else "# Performance\n"
    if RESULTS_BEGIN in text and RESULTS_END in text:
        head, rest = text.split(RESULTS_BEGIN, 1)
        region, tail = rest.split(RESULTS_END, 1)
    else:
        head, region, tail = text.rstrip("\n") + "\n\n", "", "\n"
    kept = {m.group(1): m.group(0) for m in _SECTION.finditer(region)}
    kept.update(sections)
    names = [t for t in order if t in kept] + [t for t in kept if t not in order]
    body = "\n".join(kept[name] for name in names)
    with atomic_write(path, "w") as f:
        f.write(f"{head}{RESULTS_BEGIN}\n{_RESULTS_NOTE}\n\n{body}{RESULTS_END}{tail}")
