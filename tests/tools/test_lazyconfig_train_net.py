"""tools/lazyconfig_train_net.py on configs/shapes/cnn_small.py: train, resume, evaluate, print."""

import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainkit.engine import default_argument_parser

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "lazyconfig_train_net.py"
CONFIG = "configs/shapes/cnn_small.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("lazyconfig_train_net", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _short_run(output_dir, max_iter=6, period=3):
    # A few small steps in this process: no loader workers, the 200-image minival for eval,
    # and a narrower model on 32-px images (the tool's flow is under test, not accuracy).
    return [
        "model.channels=[8,16]",
        "dataloader.train.mapper.max_size_train=32",
        "dataloader.test.mapper.max_size_test=32",
        f"train.output_dir={output_dir}",
        f"train.max_iter={max_iter}",
        f"train.checkpointer.period={period}",
        f"train.log_period={period}",
        "dataloader.train.total_batch_size=8",
        "dataloader.train.num_workers=0",
        "dataloader.test.num_workers=0",
        "dataloader.test.dataset.names=shapes_minival",
        "dataloader.evaluator.dataset_name=shapes_minival",
    ]


@pytest.fixture
def tool():
    yield _load_tool()
    for name in ("trainkit", "fvcore"):
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
            handler.close()
        lg.propagate = True


def _main(tool, *flags):
    args = default_argument_parser().parse_args(["--config-file", str(ROOT / CONFIG), *flags])
    return tool.main(args)


def _weights_and_optimizer(path):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    # A SimpleTrainer's state (the run state adds RNG states and loader positions).
    return checkpoint["model"], checkpoint["trainer"]["optimizer"]


def _assert_same_state(a, b):
    model_a, optim_a = a
    model_b, optim_b = b
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), key
    for index, state in optim_a["state"].items():
        for name, value in state.items():
            assert torch.equal(value, optim_b["state"][index][name]), (index, name)


def test_train_then_resume_from_the_middle_is_bit_exact(tool, tmp_path):
    straight = tmp_path / "straight"
    _main(tool, *_short_run(straight))
    for name in ("config.yaml", "config_origins.yaml", "metrics.json", "model_final.pth"):
        assert (straight / name).exists(), name
    assert (straight / "last_checkpoint").read_text().strip() == "model_final.pth"
    records = [json.loads(x) for x in (straight / "metrics.json").read_text().splitlines()]
    assert [r["iteration"] for r in records if "total_loss" in r][:2] == [2, 5]
    assert any("classification/top1" in r for r in records)  # the final evaluation

    # "Stopped" after 3 iterations: a fresh run starts from that run's checkpoint only.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(straight / "model_0000002.pth", resumed / "model_0000002.pth")
    (resumed / "last_checkpoint").write_text("model_0000002.pth")
    _main(tool, "--resume", *_short_run(resumed))
    _assert_same_state(
        _weights_and_optimizer(straight / "model_final.pth"),
        _weights_and_optimizer(resumed / "model_final.pth"),
    )
    resumed_records = [json.loads(x) for x in (resumed / "metrics.json").read_text().splitlines()]
    assert [r["iteration"] for r in resumed_records if "total_loss" in r] == [5]

    # --eval-only on the final weights gives the accuracy the training's last evaluation gave.
    results = _main(
        tool,
        "--eval-only",
        f"train.init_checkpoint={straight / 'model_final.pth'}",
        *_short_run(tmp_path / "eval"),
    )
    final_top1 = [r["classification/top1"] for r in records if "classification/top1" in r][-1]
    assert results["classification"]["top1"] == pytest.approx(final_top1)


def _run_tool(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(TOOL), "--config-file", CONFIG, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_print_config_shows_each_values_origin(tmp_path):
    result = _run_tool("--print-config", "train.max_iter=30", f"train.output_dir={tmp_path / 'x'}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {}
    for line in result.stdout.splitlines():
        if "  # " in line and not line.startswith("#"):
            key_value, origin = line.split("  # ", 1)
            rows[key_value.split(":", 1)[0]] = origin.strip()
    lines = (ROOT / CONFIG).read_text().splitlines()
    period_line = next(i for i, x in enumerate(lines, 1) if x.startswith("train.log_period"))
    assert rows["train.log_period"] == f"{CONFIG}:{period_line}"
    assert rows["train.max_iter"] == "command line"
    train_line = lines.index('train = model_zoo.get_config("common/train.py").train') + 1
    assert rows["train.ddp.broadcast_buffers"] == f"{CONFIG}:{train_line}"  # nothing appended
    assert rows["model.channels"].startswith(f"{CONFIG}:")
    assert not (tmp_path / "x").exists()  # nothing set up, nothing trained


def test_an_unknown_override_is_one_line_with_a_did_you_mean():
    result = _run_tool("train.max_iters=5")
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "unknown config key train.max_iters" in last and "Did you mean train.max_iter?" in last


def _top1(log):
    # print_csv_format: "copypaste: top1,top5" then "copypaste: 97.5,100.0"
    rows = re.findall(r"copypaste: (\S+)", log)
    found = [float(v.split(",")[0]) for n, v in zip(rows, rows[1:]) if n.startswith("top1,")]
    assert found, log[-3000:]
    return found[-1]


@pytest.mark.slow
def test_two_processes_train_and_resume_bit_exactly(tmp_path):
    straight = tmp_path / "straight"
    result = _run_tool("--num-gpus", "2", *_short_run(straight), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(straight / "model_0000002.pth", resumed / "model_0000002.pth")
    (resumed / "last_checkpoint").write_text("model_0000002.pth")
    result = _run_tool("--num-gpus", "2", "--resume", *_short_run(resumed), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_same_state(
        _weights_and_optimizer(straight / "model_final.pth"),
        _weights_and_optimizer(resumed / "model_final.pth"),
    )


@pytest.mark.slow
@pytest.mark.parametrize("num_gpus", [1, 2])
def test_main_job_as_a_lazyconfig_reaches_95_percent(tmp_path, num_gpus):
    # The same job as configs/shapes/cnn_small.yaml (tests/integration/test_train_net.py).
    result = _run_tool("--num-gpus", str(num_gpus), f"train.output_dir={tmp_path}", timeout=1200)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert _top1(log) >= 95.0
