"""``--print-config`` through the real scripts: keys, values and origins, then exit 0."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["train_net.py", "plain_train_net.py"])
def test_print_config_shows_origins_and_exits_without_running(script, tmp_path):
    out_dir = tmp_path / "never_created"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / script),
            "--config-file",
            "configs/smoke.yaml",
            "--num-gpus",
            "2",
            "--print-config",
            "SOLVER.BASE_LR",
            "0.3",
            "OUTPUT_DIR",
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {}
    for line in result.stdout.splitlines():
        if ":" in line and "  # " in line and not line.startswith(("#", "Command")):
            key_value, origin = line.split("  # ", 1)
            key, value = key_value.split(":", 1)
            rows[key] = (yaml.safe_load(value), origin.strip())
    smoke = (ROOT / "configs" / "smoke.yaml").read_text().splitlines()
    writer_line = smoke.index("WRITER_PERIOD: 5") + 1
    assert rows["WRITER_PERIOD"] == (5, f"configs/smoke.yaml:{writer_line}")
    assert rows["OUTPUT_DIR"] == (str(out_dir), "command line")
    # written for 1 process (Base-Shapes.yaml), asked for 2: scaled, and the origin says so
    assert rows["SOLVER.BASE_LR"][0] == pytest.approx(0.6)
    assert rows["SOLVER.BASE_LR"][1].startswith("auto-scaling from 1 to 2 processes (was 0.3")
    assert rows["SOLVER.MAX_ITER"][0] == 10
    assert rows["SOLVER.MAX_ITER"][1].startswith("auto-scaling")
    assert rows["SOLVER.REFERENCE_WORLD_SIZE"][0] == 2
    assert rows["MODEL.CLASSIFIER.CHANNELS"][1].startswith("configs/shapes/cnn_small.yaml:")
    assert "SOLVER.GAMMA" not in rows  # a default is not printed
    assert not out_dir.exists()  # nothing was set up, nothing trained
    assert "Starting training" not in result.stdout + result.stderr
