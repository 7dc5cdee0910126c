"""tools/train_net.py stops before training (one line, status 2) when a tracker is missing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist import free_port
from tests.trackers import tracker_env

ROOT = Path(__file__).resolve().parents[2]


def _shadowing_package(root: Path, name: str) -> str:
    """A directory whose ``name`` package fails to import, as if it were not installed."""
    package = root / "shadow" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'raise ImportError("No module named {name!r}")\n')
    return str(root / "shadow")


@pytest.mark.parametrize("case", ["wandb not installed", "mlflow unreachable"])
def test_a_missing_tracker_stops_train_net_before_training(tmp_path, case):
    env = {**os.environ, **tracker_env(tmp_path)}
    for name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        env.pop(name, None)
    if case == "wandb not installed":
        env["PYTHONPATH"] = os.pathsep.join([_shadowing_package(tmp_path, "wandb"), str(ROOT)])
        opts = ["WRITERS", "('console', 'wandb')", "WANDB.MODE", "offline"]
        expected = "pip install 'trainkit[wandb]'"
    else:
        env["PYTHONPATH"] = str(ROOT)
        url = f"http://127.0.0.1:{free_port()}"
        opts = ["WRITERS", "('json', 'mlflow')", "MLFLOW.TRACKING_URI", url]
        expected = f"MLFLOW.TRACKING_URI={url} is not reachable"
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "train_net.py"), "--config-file",
         str(ROOT / "configs" / "smoke.yaml"), "OUTPUT_DIR", str(out), *opts],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and expected in lines[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # Nothing was trained.
    assert not (out / "last_checkpoint").exists() and not (out / "metrics.json").exists()
