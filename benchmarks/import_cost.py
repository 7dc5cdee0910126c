"""``import_cost``: what ``import trainkit.engine`` costs beside ``import torch``.

Each round starts two fresh interpreters, one running ``import torch`` and one ``import
trainkit.engine`` (which imports torch), alternating so that a busy machine slows both
alike; the table shows the median wall time of each and their ratio. Both read compiled
bytecode: the rounds start after one untimed import of each, which writes trainkit's
``__pycache__`` where the environment allows it (with ``PYTHONDONTWRITEBYTECODE`` set, every
import compiles trainkit from source and the ratio says so). Also listed: the modules the
trainkit import adds to torch's, by top-level package, the place to look when it grows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections import Counter
from typing import Any

from benchmarks.measure import timer
from benchmarks.report import print_table, target_text, verdict

# `python -c "import trainkit.engine"` may cost at most this much more than `import torch`.
TARGET_RATIO = 1.15
_ADDED_MODULES = (
    "import sys; import torch; before = set(sys.modules); import trainkit.engine; "
    "print('\\n'.join(sorted(set(sys.modules) - before)))"
)


def _wall_s(code: str) -> float:
    with timer() as elapsed:
        subprocess.run([sys.executable, "-c", code], check=True)
    return elapsed()


def bench_import_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Time fresh ``import torch`` and ``import trainkit.engine`` processes, alternating."""
    rounds = 1 if args.quick else 5
    statements = {"torch": "import torch", "trainkit.engine": "import trainkit.engine"}
    for code in statements.values():  # untimed: caches, bytecode
        _wall_s(code)
    times: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(rounds):
        for name, code in statements.items():
            times[name].append(_wall_s(code))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["trainkit.engine"] / medians["torch"]
    judged = verdict(ratio, TARGET_RATIO, higher_is_better=False)
    compiles = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    note = "; PYTHONDONTWRITEBYTECODE set: trainkit compiled at every import" if compiles else ""
    print_table(
        f"import cost (fresh processes, alternating, median of {rounds}{note})",
        ["import", "median s", "runs s", "ratio to torch", "target", "PASS/MISS"],
        [
            ["torch", medians["torch"], " ".join(f"{t:.2f}" for t in times["torch"]), 1.0, "", ""],
            [
                "trainkit.engine",
                medians["trainkit.engine"],
                " ".join(f"{t:.2f}" for t in times["trainkit.engine"]),
                ratio,
                target_text(TARGET_RATIO, higher_is_better=False),
                judged,
            ],
        ],
    )
    added = subprocess.run(
        [sys.executable, "-c", _ADDED_MODULES], check=True, capture_output=True, text=True
    ).stdout.split()
    by_package = Counter(name.split(".")[0] for name in added)
    print(
        f"\n{len(added)} modules added to torch's: "
        + ", ".join(f"{package} {count}" for package, count in by_package.most_common())
    )
    return {
        "torch_s": medians["torch"],
        "engine_s": medians["trainkit.engine"],
        "ratio": ratio,
        "verdict": judged,
        "added_modules": dict(by_package),
        "bytecode_written": not compiles,
    }
