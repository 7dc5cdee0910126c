"""tools/replay_step.py: a 2-process run fails on a poisoned record; one process replays it.

The run (tools/train_net.py's trainer with one record mapped to a NaN image, chosen with the
step-records function so that rank 1 gets it at step 37) writes model_0000019.pth (the newest
checkpoint, CHECKPOINT_PERIOD 20) and, untagged, model_0000036.pth: the weights before step
37. The replay starts from model_0000019, replays steps 20..36 with both ranks' batches in one
process, and must reach model_0000036's weights bit for bit, then name the record and the
loss term of step 37. The command's output, options and exit status are tested on the
one-process run of tests/engine/test_failed_steps.py (fast).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.test_failed_steps import (
    POISON,
    cfg_for,
    poison,  # noqa: F401  # the fixture
    poison_record_of,
    train,
)
from trainkit.config import get_cfg
from trainkit.data.spec import TrainDataSpec
from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(__file__).with_name("poisoned_train_net.py"))
SMOKE = str(ROOT / "configs" / "smoke.yaml")
FAILING_STEP, FAILING_RANK = 37, 1
OPTS = [
    "SOLVER.MAX_ITER", "40",
    "SOLVER.CHECKPOINT_PERIOD", "20",
    "SOLVER.REFERENCE_WORLD_SIZE", "0",
    "DATALOADER.NUM_WORKERS", "0",
]  # fmt: skip


def _poisoned_record(out):
    """The image_id and printable id of rank 1's first record of step 37 (in no step before)."""
    cfg = get_cfg()
    cfg.merge_from_file(SMOKE)
    cfg.merge_from_list(["OUTPUT_DIR", str(out), *OPTS])
    spec = TrainDataSpec.from_config(cfg, world_size=2, rank=0)
    records, steps = spec.records, spec.steps_records(FAILING_STEP + 1)
    index, _ = steps[FAILING_STEP].records(FAILING_RANK, 0)[0]
    earlier = {i for step in steps[:FAILING_STEP] for i, _ in step.batch}
    assert index not in earlier
    image_id = records[index]["image_id"]
    return image_id, f"shapes_train[{index}] image_id={image_id}"


@pytest.mark.slow
def test_a_poisoned_record_is_captured_and_replayed_on_one_process(tmp_path):
    out = tmp_path / "run"
    image_id, record_id = _poisoned_record(out)
    env = dict(os.environ, TRAINKIT_TEST_POISONED_ID=str(image_id), TRAINKIT_TEST_SAVE_AT=str(36))
    args = [sys.executable, SCRIPT, "--config-file", SMOKE, "--num-gpus", "2"]
    run = subprocess.run(
        [*args, "OUTPUT_DIR", str(out), *OPTS],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    folder = out / "failed_steps" / f"iter_{FAILING_STEP}"
    assert run.returncode == NON_FINITE_EXIT_CODE, run.stderr[-3000:]
    # The run fails as before, with the folder named in its last line.
    assert "infinite or NaN at iteration=37" in run.stderr
    assert str(folder) in run.stderr.strip().splitlines()[-1]

    step = json.loads((folder / "step.json").read_text())
    assert step["iteration"] == FAILING_STEP and step["world_size"] == 2
    assert step["last_checkpoint"] == "model_0000019.pth"
    (slot,) = [s for s in step["records"] if (s["rank"], s["micro_batch"]) == (1, 0)]
    assert slot["record_ids"][0] == record_id
    rank1 = json.loads((folder / "rank1.json").read_text())
    assert rank1["rank"] == 1 and rank1["loss_terms"]["loss_cls"] != rank1["loss_terms"]["loss_cls"]
    assert len(rank1["batch_shapes"]) == 1 and len(rank1["batch_shapes"][0]) == 16
    assert (folder / "config.yaml").is_file() and (folder / "rank1_rng.pt").is_file()

    weights = tmp_path / "before_37.pth"
    replay = subprocess.run(
        [sys.executable, "tools/replay_step.py", str(folder), "--save-weights", str(weights)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert replay.returncode == NON_FINITE_EXIT_CODE, replay.stdout[-3000:] + replay.stderr[-3000:]
    assert "Replayed steps 20..36 from model_0000019.pth" in replay.stdout
    assert re.search(r"rank 1 micro-batch 0: loss_cls=nan.*not finite", replay.stdout)
    assert re.search(r"rank 0 micro-batch 0: loss_cls=\d", replay.stdout)
    bad = [line for line in replay.stdout.splitlines() if "bad record:" in line]
    assert bad == [f"  bad record: {record_id} (rank 1 micro-batch 0): loss_cls"]
    assert re.search(r"gradient norms .*rank 0: \d.*rank 1: nan, all: nan", replay.stdout)

    replayed = torch.load(weights, weights_only=True)["model"]
    saved = torch.load(out / "model_0000036.pth", weights_only=True)["model"]
    assert replayed.keys() == saved.keys()
    different = [k for k in saved if not torch.equal(replayed[k], saved[k])]
    assert not different


def _tool():
    spec = importlib.util.spec_from_file_location("replay_step", ROOT / "tools" / "replay_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("poison")
def test_the_command_prints_the_report_saves_the_weights_and_exits_as_the_run(tmp_path, capsys):
    cfg = cfg_for(tmp_path)
    index = poison_record_of(cfg, 9)
    train(cfg)
    capsys.readouterr()  # the run's log
    tool = _tool()
    folder = tmp_path / "failed_steps" / "iter_9"
    weights = tmp_path / "w" / "before.pth"
    args = tool.parse_args([str(folder), "--save-weights", str(weights)])
    assert tool.main(args) == NON_FINITE_EXIT_CODE
    # The report (log lines, which also go to stdout, left out).
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("[")]
    assert out[:3] == [
        "replayed step 8",
        "Replayed steps 8..8 from model_0000007.pth",
        "Step 9: the failure is reproduced",
    ]
    bad = f"failed_steps_regression[{index}] (rank 0 micro-batch 0): loss_mse, loss_l1"
    assert f"  bad record: {bad}" in out
    saved = torch.load(weights, weights_only=True)
    assert saved["iteration"] == 8 and "hidden.weight" in saved["model"]
    # Started from the step itself (a checkpoint given): nothing replayed before it.
    POISON["index"] = -1
    args = tool.parse_args([str(folder), "--checkpoint", str(tmp_path / "model_0000007.pth")])
    step = json.loads((folder / "step.json").read_text())
    step["iteration"], step["records"] = 8, None  # the records listed are step 9's
    (folder / "step.json").write_text(json.dumps(step))
    assert tool.main(args) == 0
    assert "Step 8: did NOT fail in the replay" in capsys.readouterr().out
