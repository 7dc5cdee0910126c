"""configs/shapes/vit_fsdp.yaml through the real command line: accuracy and checkpoints."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
VIT_CONFIG = str(ROOT / "configs" / "shapes" / "vit_fsdp.yaml")


def _top1(output: str) -> float:
    match = re.findall(r"classification\s+top1\s+([\d.]+)", output)
    assert match, output[-3000:]
    return float(match[-1])


@pytest.mark.slow
def test_the_sharded_vit_reaches_95_percent_writes_directories_and_resumes(tmp_path):
    # The full run on 2 processes (sized for about 5 minutes on 2 CPU cores; 10 at most).
    result = subprocess.run(
        [sys.executable, TRAIN_NET, "--config-file", VIT_CONFIG, "--num-gpus", "2",
         "OUTPUT_DIR", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert _top1(log) >= 95.0
    # Under FSDP a checkpoint is a directory (model_final/), otherwise a file (.pth): the tag
    # names either, and it must exist.
    tag = (tmp_path / "last_checkpoint").read_text().strip()
    assert tag == "model_final", tag
    periodic = sorted(p.name for p in tmp_path.glob("model_0*"))
    for name in [*periodic, "model_final"]:  # sharded directories, each process's shards
        assert (tmp_path / name / ".metadata").is_file(), name
        assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in (tmp_path / name).iterdir()}
    # --resume continues it: from the middle checkpoint (as after a crash there), the same
    # world size, bit for bit on the CPU, so the same accuracy to the last digit.
    middle = periodic[0]
    for later in [*periodic[1:], "model_final"]:
        shutil.rmtree(tmp_path / later)
    (tmp_path / "last_checkpoint").write_text(middle)
    resumed = subprocess.run(
        [sys.executable, TRAIN_NET, "--config-file", VIT_CONFIG, "--num-gpus", "2", "--resume",
         "OUTPUT_DIR", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )  # fmt: skip
    resumed_log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, resumed_log[-3000:]
    assert f"Resuming from {tmp_path / middle}" in resumed_log
    assert _top1(resumed_log) == _top1(log)
