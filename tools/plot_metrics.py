#!/usr/bin/env python
"""Plot a run's curves from its ``metrics.json``: losses, learning rate, validation, evaluation.

    python tools/plot_metrics.py output/shapes_cnn_small
    python tools/plot_metrics.py output/run_a output/run_b --output compare.png

Each plotted key gets its own panel in a grid (losses first, then ``lr``, ``validation/*``
and evaluation results such as ``classification/top1``), with every run drawn in it in its
own colour; the legend names the run directories. A run resumed after a crash may repeat
iterations in its file: the value written last for an iteration is the one plotted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict

from trainkit.utils.errors import MissingFileError, UsageError, install_usage_error_handler

Series = dict[str, list[tuple[int, float]]]  # key -> [(iteration, value), ...]

# Scalars about speed and bookkeeping, not about learning.
_NOT_PLOTTED_PREFIXES = ("data/", "[metric]")


def read_metrics(output_dir: str) -> Series:
    """Return every numeric series of ``output_dir/metrics.json``, by key, sorted by iteration.

    Raises:
        MissingFileError: If the directory has no ``metrics.json``.
    """
    path = os.path.join(output_dir, "metrics.json")
    if not os.path.isfile(path):
        raise MissingFileError(
            f"no metrics.json in {output_dir}; pass the OUTPUT_DIR of a run (it writes "
            "metrics.json every WRITER_PERIOD iterations)."
        )
    latest: dict[str, dict[int, float]] = defaultdict(dict)
    skipped = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1  # a line cut short by a run that is still writing or crashed
                continue
            iteration = record.get("iteration")
            if not isinstance(iteration, int):
                continue
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    latest[key][iteration] = float(value)  # a resumed run's rewrite wins
    if skipped:
        print(f"{path}: skipped {skipped} line(s) that are not JSON", file=sys.stderr)
    latest.pop("iteration", None)
    return {key: sorted(points.items()) for key, points in latest.items()}


def plotted_keys(keys: list[str] | set[str]) -> list[str]:
    """Return the keys worth a panel, in display order: losses, lr, validation, evaluation."""
    losses = sorted(k for k in keys if "loss" in k and "/" not in k)
    if "total_loss" in losses:  # the sum first, then its parts
        losses.remove("total_loss")
        losses.insert(0, "total_loss")
    lr = [k for k in keys if k == "lr"]
    validation = sorted(k for k in keys if k.startswith("validation/"))
    evaluation = sorted(
        k
        for k in keys
        if "/" in k and not k.startswith("validation/") and not k.startswith(_NOT_PLOTTED_PREFIXES)
    )
    return losses + lr + validation + evaluation


def run_labels(output_dirs: list[str]) -> list[str]:
    """Name each run by its directory's name, or by its path where two names are the same."""
    names = [os.path.basename(os.path.normpath(d)) for d in output_dirs]
    if len(set(names)) == len(names):
        return names
    return [os.path.normpath(d) for d in output_dirs]


def plot(runs: dict[str, Series], output: str) -> None:
    """Draw one panel per plotted key, every run overlaid, and save the figure to ``output``.

    Raises:
        UsageError: If no run has anything to plot.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    keys = plotted_keys({key for series in runs.values() for key in series})
    if not keys:
        raise UsageError(
            f"nothing to plot in the metrics.json of {', '.join(runs)}: no loss, lr or "
            "evaluation metric was written yet."
        )
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.0 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = {}
    for ax, key in zip(axes.flat, keys):
        for index, (label, series) in enumerate(runs.items()):
            points = series.get(key)
            if not points:
                continue
            xs, ys = zip(*points)
            # evaluations are a few points: show each one
            marker = "o" if len(points) <= 30 else None
            (line,) = ax.plot(xs, ys, color=colors[index % len(colors)], marker=marker, ms=3)
            handles.setdefault(label, line)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=min(4, len(handles)))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.0 * nrows)))
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, plot, and return the path of the PNG written."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dirs", nargs="+", metavar="OUTPUT_DIR", help="run directories")
    parser.add_argument(
        "--output",
        metavar="FILE.png",
        help="where to write the figure (default: OUTPUT_DIR/metrics.png for one run, "
        "metrics.png here for several)",
    )
    args = parser.parse_args(argv)
    output = args.output or (
        os.path.join(args.output_dirs[0], "metrics.png")
        if len(args.output_dirs) == 1
        else "metrics.png"
    )
    labels = run_labels(args.output_dirs)
    runs = {label: read_metrics(d) for label, d in zip(labels, args.output_dirs)}
    plot(runs, output)
    return output


if __name__ == "__main__":
    install_usage_error_handler()  # a missing file: one line, exit status 2
    print(f"wrote {main()}")
