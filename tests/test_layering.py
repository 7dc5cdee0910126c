"""The layering is a contract: ``lint-imports`` checks it (configured in pyproject.toml).

utils < config < data, solver, checkpoint, modeling, evaluation < launcher < engine; the
middle packages do not import one another, the library never imports ``benchmarks``, no
modules of a package import each other in a cycle, and inside ``data`` nothing imports the
builder, a loader or the training-data spec from below them.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    # The console script of the import-linter package (the `test` extra), next to python.
    lint = Path(sys.executable).with_name("lint-imports")
    command = [str(lint)] if lint.exists() else ["lint-imports"]
    return subprocess.run(
        [*command, "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
    )


def test_the_import_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_contracts_catch_an_upward_import_and_a_cycle(tmp_path):
    """Guard against a vacuous contract: a copy of the tree with two bad imports fails."""
    shutil.copytree(ROOT / "trainkit", tmp_path / "trainkit")
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "trainkit" / "data" / "catalog.py", "a") as f:
        f.write("\nimport trainkit.engine  # upward\n")
    with open(tmp_path / "trainkit" / "utils" / "history_buffer.py", "a") as f:
        f.write("\nimport trainkit.utils.event_storage  # which imports history_buffer\n")
    # A circle of annotations is a circle too (the loop imports hook_base at run time).
    with open(tmp_path / "trainkit" / "engine" / "hook_base.py", "a") as f:
        f.write("\nfrom typing import TYPE_CHECKING  # noqa: E402\n")
        f.write("if TYPE_CHECKING:\n    import trainkit.engine.trainer_base\n")
    with open(tmp_path / "trainkit" / "data" / "records" / "rank_dataset.py", "a") as f:
        f.write("\nimport trainkit.data.build  # the builder, from below it\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "trainkit.data.catalog -> trainkit.engine" in result.stdout
    assert "trainkit.data.records.rank_dataset -> trainkit.data.build" in result.stdout
    assert "No cycles are allowed in trainkit.utils" in result.stdout
    assert "No cycles are allowed in trainkit.engine" in result.stdout
