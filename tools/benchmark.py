"""Benchmarks of trainkit, each printed as a table next to the baseline it replaces.

Usage::

    python tools/benchmark.py --task TASK [TASK ...] [--json OUT] [--quick | --write-docs]

    TASK: sampler, data_memory, metafile, train, data, launch, checkpoint, eval, goodput,
          import_cost, compile or all

``--write-docs`` puts each task's tables (with the command, the date and the machine) into
``docs/performance.md``, keeping the page's hand-written explanations; ``--quick`` (tiny
sizes, for tests) never writes it.

The tasks live in the ``benchmarks/`` package (one module per task; the registry and the
options are in ``benchmarks/runner.py``); this script only runs them.
"""

from __future__ import annotations

import os
import sys

# The benchmarks package sits beside tools/ at the repository root, which a script run by
# path does not have on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.runner import main  # noqa: E402

if __name__ == "__main__":
    main()
