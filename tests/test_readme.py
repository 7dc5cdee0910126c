"""The README's commands are the ones CI runs."""

import re
from pathlib import Path

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

    code = next(b for b in _python_blocks((ROOT / "README.md").read_text()) if "class RegressionTrainer" in b)
    script = tmp_path / "train_linear.py"
    script.write_text(code)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(script), "SOLVER.MAX_ITER", "150", "OUTPUT_DIR", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    mse = [m["regression/mse"] for m in metrics if "regression/mse" in m]
    assert mse and mse[-1] < 1.0, mse  # the data has variance ~204; the model fits it
    assert (out / "model_final.pth").exists()
