"""Each benchmark task added for issue 7 runs end to end in --quick mode.

Structure only (tables, JSON keys, PASS/MISS verdicts); no timing is asserted. One
subprocess runs every task, so torch is imported once (about 35 s on 2 cores in all).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEW_TASKS = ["train", "data", "launch", "checkpoint", "eval"]

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "benchmark.py"),
            "--task",
            *NEW_TASKS,
            "--quick",
            "--json",
            str(out),
            "--workdir",
            str(out.parent),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _tables(stdout):
    """Return {title: [header cells, *rows]} of the Markdown tables printed."""
    tables, title = {}, None
    for line in stdout.splitlines():
        if line.startswith("### "):
            title = line[4:]
            tables[title] = []
        elif line.startswith("| ") and title is not None:
            tables[title].append([c.strip() for c in line.strip("|").split("|")])
    return tables


def test_every_task_reports_json(quick_run):
    _, results = quick_run
    assert sorted(results) == sorted(NEW_TASKS)


def test_every_table_has_target_and_verdict_columns(quick_run):
    stdout, _ = quick_run
    tables = _tables(stdout)
    assert len(tables) == 9  # 2 train (step, EMA), 2 data, 2 launch, 2 checkpoint, eval
    for title, (header, *rows) in tables.items():
        assert header[-2:] == ["target", "PASS/MISS"] or header[-2:] == [
            "target (launch)",
            "PASS/MISS",
        ], title
        assert rows, title
        verdicts = [r[-1] for r in rows if r[-1]]
        assert verdicts and set(verdicts) <= {"PASS", "MISS"}, (title, verdicts)


def test_train_json(quick_run):
    train = quick_run[1]["train"]
    assert sorted(train) == ["accum", "clf", "ddp", "ema", "mlp"]
    for case in train.values():
        assert case["trainkit_s"] > 0 and case["plain_s"] > 0
        assert case["ratio"] == pytest.approx(case["trainkit_s"] / case["plain_s"])
        assert case["verdict"] in ("PASS", "MISS")


def test_data_json(quick_run):
    data = quick_run[1]["data"]
    assert {(r["workers"], r["kind"]) for r in data["throughput"]} == {
        (w, k) for w in (0, 2) for k in ("grouping on", "grouping off")
    }
    assert len(data["padding"]) == 5
    for row in data["padding"]:
        assert 0 <= row["padded_to_max"] <= row["padded_after_divisibility"] < 1
    # Two targets, then the per-image rescale comparison, which has none.
    assert [c["verdict"] for c in data["padding_checks"]][2] == ""
    assert [c["verdict"] in ("PASS", "MISS") for c in data["padding_checks"]] == [True, True, False]


def test_launch_json(quick_run):
    launch = quick_run[1]["launch"]
    assert launch["startup"]["trainkit_s"] > 0 and launch["startup"]["spawn_s"] > 0
    assert [f["case"] for f in launch["failure"]] == ["rank 1 raises", "rank 1 SIGKILLed"]
    for f in launch["failure"]:
        assert f["trainkit"] >= 0 and f["spawn"] >= 0


def test_checkpoint_and_eval_json(quick_run):
    ckpt, ev = quick_run[1]["checkpoint"], quick_run[1]["eval"]
    assert ckpt["size_mb"] > 0 and len(ckpt["ratios"]) == 4
    assert all(v > 0 for v in ckpt["medians"].values())
    blocking = ckpt["blocking"]
    assert blocking["sync_blocked_s"] > 0 and blocking["async_blocked_s"] > 0
    assert blocking["ratio"] == pytest.approx(
        blocking["async_blocked_s"] / blocking["sync_blocked_s"]
    )
    assert blocking["verdict"] in ("PASS", "MISS")
    assert ev["images"] > 0 and ev["verdict"] in ("PASS", "MISS")
