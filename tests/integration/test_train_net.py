"""The main job through the real command line, in subprocesses (short runs)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
SMOKE = str(ROOT / "configs" / "smoke.yaml")


def _run(args, timeout=300, **kwargs):
    return subprocess.run(
        [sys.executable, TRAIN_NET, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        **kwargs,
    )


def _top1(output: str) -> float:
    match = re.findall(r"classification\s+top1\s+([\d.]+)", output)
    assert match, output[-3000:]
    return float(match[-1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    result = _run(["--config-file", SMOKE, "OUTPUT_DIR", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result.stdout + result.stderr


def test_train_writes_every_receipt(trained):
    out, log = trained
    for name in (
        "config.yaml",
        "env.txt",
        "log.txt",
        "metrics.json",
        "model_final.pth",
        "model_0000009.pth",
        "last_checkpoint",
    ):
        assert (out / name).exists(), name
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(out))
    assert (out / "last_checkpoint").read_text().strip() == "model_final.pth"
    lines = [json.loads(x) for x in (out / "metrics.json").read_text().splitlines()]
    assert [x["iteration"] for x in lines if "total_loss" in x][:2] == [4, 9]
    assert "eta:" in log and "Final results" in log
    assert 0.0 <= _top1(log) <= 100.0


def test_eval_only_reproduces_the_final_accuracy(trained):
    out, log = trained
    result = _run(
        [
            "--config-file",
            SMOKE,
            "--eval-only",
            "MODEL.WEIGHTS",
            str(out / "model_final.pth"),
            "OUTPUT_DIR",
            str(out / "eval"),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _top1(result.stdout + result.stderr) == _top1(log)


@pytest.mark.slow  # 19 s; kills at three points are tests/reliability/test_faults.py's
def test_resume_after_a_kill_continues_from_last_checkpoint(tmp_path):
    cmd = [
        sys.executable,
        TRAIN_NET,
        "--config-file",
        SMOKE,
        "OUTPUT_DIR",
        str(tmp_path),
        "SOLVER.MAX_ITER",
        "60",
        "SOLVER.CHECKPOINT_PERIOD",
        "10",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "model_0000019.pth").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    tag = (tmp_path / "last_checkpoint").read_text().strip()
    saved_iter = int(re.match(r"model_(\d+)\.pth", tag).group(1))
    assert saved_iter >= 19
    assert saved_iter < 59, "the run finished before it was killed; nothing was resumed"
    result = _run(
        [
            "--config-file",
            SMOKE,
            "--resume",
            "OUTPUT_DIR",
            str(tmp_path),
            "SOLVER.MAX_ITER",
            "60",
            "SOLVER.CHECKPOINT_PERIOD",
            "10",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Starting training from iteration {saved_iter + 1}" in result.stdout + result.stderr
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"


@pytest.mark.distributed
def test_two_processes_train_and_auto_scale(tmp_path):
    result = _run(["--config-file", SMOKE, "--num-gpus", "2", "OUTPUT_DIR", str(tmp_path)])
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "Auto-scaling the config from 1 to 2 processes" in log
    assert "MAX_ITER=10" in log
    assert (tmp_path / "model_final.pth").exists() and (tmp_path / "log.txt.rank1").exists()
    assert 0.0 <= _top1(log) <= 100.0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


USER_ERRORS = [
    (["--config-file", "nope.yaml"], "config file not found: nope.yaml"),
    (["--config-file", SMOKE, "SOLVER.BASE_LRR", "0.1"], "Did you mean SOLVER.BASE_LR?"),
    (
        ["--config-file", SMOKE, "SOLVER.MAX_ITER", "many"],
        "SOLVER.MAX_ITER (in the command line) expects int",
    ),
    (
        ["--config-file", SMOKE, "DATASETS.TRAIN", "('nope',)"],
        "Dataset 'nope' is not registered. Registered: ",
    ),
    (
        ["--config-file", SMOKE, "MODEL.META_ARCHITECTURE", "Nope"],
        "MODEL.META_ARCHITECTURE 'Nope' is not registered",
    ),
    (
        ["--config-file", SMOKE, "--num-gpus", "3", "SOLVER.REFERENCE_WORLD_SIZE", "0"],
        "SOLVER.IMS_PER_BATCH=32 is not a positive multiple of the world size (3)",
    ),
    (
        ["--config-file", SMOKE, "--num-machines", "2", "--machine-rank", "2"],
        "--machine-rank 2 is out of range",
    ),
    (
        ["--config-file", SMOKE, "MODEL.WEIGHTS", "/no/such.pth"],
        "MODEL.WEIGHTS file not found: /no/such.pth",
    ),
    (["--config-file", SMOKE, "--num-machines", "2"], "--dist-url auto works on one machine only"),
    (
        ["--config-file", SMOKE, "SOLVER.IMS_PER_BATCH", "0"],
        "SOLVER.IMS_PER_BATCH=0 is not a positive multiple",
    ),
    (["--config-file", SMOKE, "SOLVER.MAX_ITER", "-5"], "SOLVER.MAX_ITER must be positive, got -5"),
    (
        ["--config-file", SMOKE, "DATALOADER.NUM_WORKERS", "-1"],
        "DATALOADER.NUM_WORKERS must be >= 0, got -1",
    ),
    (
        ["--config-file", SMOKE, "DATALOADER.ASPECT_RATIO_BINS", "[2, 1]"],
        "DATALOADER.ASPECT_RATIO_BINS must be",
    ),
    (["--config-file", SMOKE, "MODEL.DEVICE", "gpu0"], "MODEL.DEVICE='gpu0' is not a device name"),
    (
        ["--config-file", SMOKE, "MODEL.DEVICE", "cuda"] if not _cuda() else ["--num-gpus", "0"],
        "CUDA is not available on this machine" if not _cuda() else "--num-gpus must be at least 1",
    ),
    (["--config-file", SMOKE, "SOLVER.BASE_LR", "-1"], "SOLVER.BASE_LR must be >= 0, got -1.0"),
    (["--config-file", SMOKE, "SOLVER.OPTIMIZER", "Nope"], "Unknown SOLVER.OPTIMIZER 'Nope'"),
    (
        ["--config-file", SMOKE, "SOLVER.LR_SCHEDULER_NAME", "Nope"],
        "Unknown SOLVER.LR_SCHEDULER_NAME 'Nope'",
    ),
    (
        ["--config-file", SMOKE, "INPUT.RANDOM_SCALE", "[0, 1]"],
        "INPUT.RANDOM_SCALE must be [min, max]",
    ),
    (
        ["--config-file", SMOKE, "MODEL.NUM_CLASSES", "4"],
        "MODEL.NUM_CLASSES=4 but dataset 'shapes_train' has 6 classes; set MODEL.NUM_CLASSES 6.",
    ),
]


# One of each kind in the default run (each case starts the script: ~5 s); all in `slow`.
_DEFAULT_RUN_CASES = {0, 1, 3, 5, 7, 19}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        case if i in _DEFAULT_RUN_CASES else pytest.param(*case, marks=pytest.mark.slow)
        for i, case in enumerate(USER_ERRORS)
    ],
)
def test_user_errors_are_one_line_with_status_2(args, message):
    result = _run(args, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    stderr_lines = result.stderr.strip().splitlines()
    assert len(stderr_lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in stderr_lines[0]


def _one_line_status_2(result):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_weights_of_other_shapes_are_refused_with_the_keys(trained):
    out, _ = trained
    line = _one_line_status_2(
        _run(
            [
                "--config-file",
                SMOKE,
                "MODEL.WEIGHTS",
                str(out / "model_final.pth"),
                "MODEL.NUM_CLASSES",
                "8",
            ],
            timeout=120,
        )
    )
    assert re.search(
        r"2 entries have other shapes .*head\.weight \(6, \d+\) vs \(8, \d+\); "
        r"head\.bias \(6,\) vs \(8,\)",
        line,
    ), line
    assert "MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH True" in line


def test_resume_from_a_checkpoint_of_other_shapes_is_refused(trained, tmp_path):
    out, _ = trained
    (tmp_path / "model_final.pth").write_bytes((out / "model_final.pth").read_bytes())
    (tmp_path / "last_checkpoint").write_text("model_final.pth")
    line = _one_line_status_2(
        _run(
            [
                "--config-file",
                SMOKE,
                "--resume",
                "OUTPUT_DIR",
                str(tmp_path),
                "MODEL.NUM_CLASSES",
                "8",
            ],
            timeout=120,
        )
    )
    assert f"Checkpoint {tmp_path / 'model_final.pth'} does not fit the model" in line
    assert "run with the config that wrote it, or train into another OUTPUT_DIR" in line


def test_corrupt_weights_file_is_named(tmp_path):
    weights = tmp_path / "broken.pth"
    weights.write_bytes(b"not a checkpoint")
    line = _one_line_status_2(
        _run(["--config-file", SMOKE, "MODEL.WEIGHTS", str(weights)], timeout=120)
    )
    assert f"Cannot read checkpoint {weights}" in line and "truncated or corrupt" in line
    assert (
        "weights_only` set to `False` will likely succeed" not in line
    )  # torch's advice is wrong here


def test_allowing_shape_mismatch_fine_tunes_a_new_head(trained, tmp_path):
    out, _ = trained
    result = _run(
        [
            "--config-file",
            SMOKE,
            "MODEL.WEIGHTS",
            str(out / "model_final.pth"),
            "MODEL.NUM_CLASSES",
            "8",
            "MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH",
            "True",
            "SOLVER.MAX_ITER",
            "2",
            "OUTPUT_DIR",
            str(tmp_path),
        ]
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "skipped 2 entries whose shapes differ" in log


def test_binary_config_file_is_a_one_line_error(tmp_path):
    config = tmp_path / "model.pth.yaml"
    config.write_bytes(b"PK\x03\x04\xe7\x00\xff binary")
    line = _one_line_status_2(_run(["--config-file", str(config)], timeout=120))
    assert f"config file {config} is not UTF-8 text" in line


def test_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("SOLVER:\n  BASE_LR: [0.1\n")
    result = _run(["--config-file", str(bad)], timeout=120)
    assert result.returncode == 2
    assert re.search(r"YAML syntax error in .*bad\.yaml at line \d+", result.stderr)


def test_visualize_data_writes_batch_grids(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "visualize_data.py"),
            "--config-file",
            SMOKE,
            "--output-dir",
            str(tmp_path),
            "--num-batches",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    from PIL import Image

    for i in range(2):
        with Image.open(tmp_path / f"batch_{i:03d}.png") as im:
            assert im.width > 0 and im.height > 0


MAIN_CONFIG = str(ROOT / "configs" / "shapes" / "cnn_small.yaml")


@pytest.mark.slow
@pytest.mark.parametrize("num_gpus", [1, 2])
def test_main_job_reaches_95_percent(tmp_path, num_gpus):
    # The full-length run of the README's main command (about 1.5 min on 2 CPU cores).
    result = _run(
        ["--config-file", MAIN_CONFIG, "--num-gpus", str(num_gpus), "OUTPUT_DIR", str(tmp_path)],
        timeout=1200,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert _top1(log) >= 95.0


_EARLY_STOP = [
    "TEST.EVAL_PERIOD", "2", "TEST.VAL_LOSS", "True",
    "TEST.EARLY_STOP.METRIC", "validation/total_loss", "TEST.EARLY_STOP.MODE", "min",
    "TEST.EARLY_STOP.PATIENCE", "1", "TEST.EARLY_STOP.MIN_DELTA", "1000",
]  # fmt: skip


@pytest.mark.slow
def test_early_stop_exits_0_with_a_final_checkpoint_and_resume_does_not_train(tmp_path):
    args = ["--config-file", SMOKE, "OUTPUT_DIR", str(tmp_path), *_EARLY_STOP]
    result = _run(args)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    # nothing beats the first validation loss by 1000: the second evaluation (after 3) stops
    assert "Training stopped early after iteration 3 of 20: early stopping: validation/" in log
    assert "Validation losses over 200 records" in log
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"
    lines = [json.loads(x) for x in (tmp_path / "metrics.json").read_text().splitlines()]
    # metrics.json says why it stopped: the stopping iteration's scalars, then the reason
    assert lines[-1]["iteration"] == 3
    assert lines[-1]["stop_reason"].startswith("early stopping: validation/")
    assert lines[-2]["iteration"] == 3 and lines[-2]["early_stop/stopped"] == 1
    assert "validation/loss_cls" in lines[-2]

    resumed = _run([*args[:2], "--resume", *args[2:]])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Not training: this run stopped early after iteration 3" in resumed.stdout
    assert len((tmp_path / "metrics.json").read_text().splitlines()) == len(lines)
