"""Measuring: memory of a process tree, timers, forked cases, alternating A/B rounds.

Memory is read from ``/proc/<pid>/smaps_rollup`` and summed over a process tree (a job's
launcher, ranks and loader workers), because per-process RSS counts shared pages once per
process: PSS splits each shared page among the processes that map it, so its sum over a
tree counts every page once; USS (private clean + private dirty) is what a process alone
holds. All sizes are bytes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

MiB = float(2**20)


def smaps_rollup(pid: int) -> dict[str, int]:
    """Return the ``smaps_rollup`` fields of ``pid`` in bytes ({} if the process is gone)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    return fields


def memory_of(pid: int) -> dict[str, int]:
    """Return ``{"pss", "pss_data", "uss", "anon", "rss"}`` of one process in bytes.

    ``pss_data`` is the PSS of anonymous and shared-memory pages only: what the process
    allocated, without the pages of files (libraries, code) it maps.
    """
    f = smaps_rollup(pid)
    return {
        "pss": f.get("Pss", 0),
        "pss_data": f.get("Pss_Anon", 0) + f.get("Pss_Shmem", 0),
        "uss": f.get("Private_Clean", 0) + f.get("Private_Dirty", 0),
        "anon": f.get("Anonymous", 0),
        "rss": f.get("Rss", 0),
    }


def descendants(root: int) -> list[int]:
    """Return ``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces; the fields after the last ')' are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _memfd_usage(pid: int, sizes: dict[int, int]) -> int:
    """Return the PSS of ``pid``'s memfd mappings; record each memfd's size in ``sizes``."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    sizes[st.st_ino] = st.st_size
            except OSError:
                continue
        pss, in_memfd = 0, False
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    in_memfd = "/memfd:" in line
                elif in_memfd and line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        return pss
    except OSError:
        return 0


def tree_memory(root: int, *, count_memfd: bool = False) -> dict[str, int]:
    """Return PSS, USS, anonymous and RSS summed over ``root``'s process tree, plus ``procs``.

    ``memfd`` is the size of the distinct memfds the tree holds (0 without ``count_memfd``).

    With ``count_memfd``, ``pss`` counts every anonymous memory file (memfd) that a process
    of the tree holds at its full size, once, instead of the PSS of its mapped, touched
    pages: a segment written but not (yet) read by anyone occupies memory that no page
    table shows.
    """
    total = {"pss": 0, "pss_data": 0, "uss": 0, "anon": 0, "rss": 0, "procs": 0, "memfd": 0}
    memfd_sizes: dict[int, int] = {}
    for pid in descendants(root):
        mem = memory_of(pid)
        if mem["rss"]:
            total["procs"] += 1
            for key, value in mem.items():
                total[key] += value
            if count_memfd:
                total["pss"] -= _memfd_usage(pid, memfd_sizes)
    total["memfd"] = sum(memfd_sizes.values())
    total["pss"] += total["memfd"]
    return total


class TreeSampler:
    """Sample :func:`tree_memory` of a process tree in a background thread.

    Attributes:
        samples: ``(time.monotonic(), tree_memory dict)`` pairs.
    """

    def __init__(self, root: int, interval_s: float = 0.02, *, count_memfd: bool = False) -> None:
        """Watch the tree below ``root`` every ``interval_s`` seconds once started."""
        self.root = root
        self.count_memfd = count_memfd
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            memory = tree_memory(self.root, count_memfd=self.count_memfd)
            self.samples.append((time.monotonic(), memory))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[dict[str, int]]:
        """Return the samples taken in ``[start, end]``."""
        return [m for t, m in self.samples if start <= t <= end]

    def first_after(self, t: float) -> dict[str, int]:
        """Return the first sample taken after ``t``."""
        after = [m for ts, m in self.samples if ts > t]
        return after[0] if after else self.samples[-1][1]

    def last_before(self, t: float) -> dict[str, int]:
        """Return the last sample taken before ``t``."""
        before = [m for ts, m in self.samples if ts < t]
        return before[-1] if before else self.samples[0][1]


@contextlib.contextmanager
def timer() -> Iterator[Callable[[], float]]:
    """``with timer() as elapsed:`` ... ``elapsed()`` gives seconds since entering."""
    began = time.perf_counter()
    yield lambda: time.perf_counter() - began


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have exited.

    Loader workers are such children once the loader's iterator has shut them down, so the
    difference around a run is what the run cost on every core, however busy the machine.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_forked(fn: Callable[..., Any], *args: Any, start_method: str = "fork") -> Any:
    """Run ``fn(*args)`` in a child process and return its (picklable) result.

    Each measurement gets a fresh process, so memory freed by one case (or kept by the
    allocator) does not blur the next one. A forked child shares its heap copy-on-write
    with this process; ``start_method="spawn"`` starts a fresh interpreter instead (``fn``
    must then be importable), whose memory no process outside its own tree shares.
    """
    ctx = mp.get_context(start_method)
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_send_result, args=(child, fn, args))
    proc.start()
    status, payload = parent.recv()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"benchmark case {fn.__name__}{args} failed: {payload}")
    return payload


def _send_result(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as e:  # reported to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))


def self_memory() -> dict[str, int]:
    """Return this process's memory plus its peak RSS (``VmHWM``) in bytes."""
    mem = memory_of(os.getpid())
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                mem["hwm"] = int(line.split()[1]) * 1024
    return mem


# --------------------------------------------------------------------------- A/B timing


def alternate(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run every case once per round, reversing the order each round (A B, B A, ...).

    Alternating spreads slow phases of a shared machine (another job, a thermal dip) over
    all cases instead of charging them to whichever case ran then.

    Returns:
        ``{case: [the value each round's call returned]}``.
    """
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            samples[name].append(float(cases[name]()))
    return samples


def median(values: list[float]) -> float:
    """Return the median of ``values`` (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
