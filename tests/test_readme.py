"""The README's commands are the ones CI runs."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    test_command = next(b for b in blocks if "pytest" in b).strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def _python_blocks(readme: str) -> list:
    return re.findall(r"```python\n(.*?)\n```", readme, flags=re.S)


def test_new_task_example_trains_and_evaluates(tmp_path):
    import json
    import subprocess
    import sys

    code = next(
        b
        for b in _python_blocks((ROOT / "README.md").read_text())
        if "class RegressionTrainer" in b
    )
    script = tmp_path / "train_linear.py"
    script.write_text(code)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(script), "SOLVER.MAX_ITER", "150", "OUTPUT_DIR", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    mse = [m["regression/mse"] for m in metrics if "regression/mse" in m]
    assert mse and mse[-1] < 1.0, mse  # the data has variance ~204; the model fits it
    assert (out / "model_final.pth").exists()


def _readme_script(tmp_path):
    code = next(
        b
        for b in _python_blocks((ROOT / "README.md").read_text())
        if "class RegressionTrainer" in b
    )
    script = tmp_path / "train_linear.py"
    script.write_text(code)
    return script


def _run_script(script, *args, cwd):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


# (arguments, what the single stderr line must name). Each case starts the script (~5 s): the
# default run keeps one per kind of mistake (a config key, a flag, a file), slow runs all.
_BAD_INPUT = [
    (["SOLVER.BASE_LRR", "0.1"], "SOLVER.BASE_LR"),
    pytest.param(["DATASETS.TRAIN", "('no_such_set',)"], "no_such_set", marks=pytest.mark.slow),
    (["SOLVER.IMS_PER_BATCH", "3", "--num-gpus", "2"], "--num-gpus came after"),
    pytest.param(
        ["--num-gpus", "2", "SOLVER.IMS_PER_BATCH", "3"], "IMS_PER_BATCH", marks=pytest.mark.slow
    ),
    (["MODEL.WEIGHTS", "missing.pth"], "missing.pth"),
    pytest.param(["OUTPUT_DIR", "/proc/no_such_dir"], "OUTPUT_DIR", marks=pytest.mark.slow),
    pytest.param(["--num-gpus", "0"], "--num-gpus", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("args, named", _BAD_INPUT)
def test_new_task_example_reports_bad_input_in_one_line(tmp_path, args, named):
    """A user's own script built the detectron2 way gets the library's one-line errors."""
    script = _readme_script(tmp_path)
    result = _run_script(script, *args, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (args, result.stderr[-2000:])
    assert len(lines) == 1 and named in lines[0], (args, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
