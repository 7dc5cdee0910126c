"""Every benchmark task runs end to end in --quick mode, through the README's command.

Structure only (tables, JSON keys, targets and PASS/MISS verdicts); no timing is asserted.
One subprocess runs every task, so torch is imported once (about 2-3 minutes on 2 cores).
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.measure import median

ROOT = Path(__file__).resolve().parents[2]
TASKS = [
    "sampler",
    "data_memory",
    "metafile",
    "train",
    "data",
    "mapper",
    "launch",
    "checkpoint",
    "eval",
    "goodput",
    "import_cost",
    "device",
    "compile",
    "fsdp",
]

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


PERFORMANCE_PAGE = ROOT / "docs" / "performance.md"


def _page_digest():
    return hashlib.sha256(PERFORMANCE_PAGE.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    page_before = _page_digest()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "benchmark.py"),
            "--task",
            "all",
            "--quick",
            "--json",
            str(out),
            "--workdir",
            str(out.parent),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # A --quick run is a test of the tasks, not a measurement: the page keeps its figures.
    assert _page_digest() == page_before
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
    assert sorted(results) == sorted(TASKS)


def test_every_table_has_target_and_verdict_columns(quick_run):
    stdout, _ = quick_run
    tables = _tables(stdout)
    # sampler 2, metafile 2, data_memory 1, train 2 (step, EMA), data 5 (map-style, stream,
    # grouping sizes, padding, mixing), mapper 2 (per image, seeding), launch 2,
    # checkpoint 2, eval 1, goodput 1, import_cost 1, device 1, compile 1, fsdp 2 (state, dry run)
    assert len(tables) == 25
    for title, (header, *rows) in tables.items():
        assert header[-2] in ("target", "target (launch)"), title
        assert header[-1] == "PASS/MISS", title
        assert rows, title
        verdicts = [r[-1] for r in rows if r[-1]]
        assert verdicts and set(verdicts) <= {"PASS", "MISS"}, (title, verdicts)
        for row in rows:  # a verdict always comes with the target it was judged against
            assert bool(row[-1]) == bool(row[-2]), (title, row)


def test_goodput_json(quick_run):
    results = quick_run[1]["goodput"]
    assert [(r["checkpoints"], r["period"]) for r in results["rows"]] == [
        ("sync", 10),
        ("async", 10),
    ]
    for row in results["rows"]:
        # Every scheduled kill happened and the job recovered from it by itself...
        assert len(row["failures"]) == len(results["kills"]) == 2
        for failure in row["failures"]:
            assert failure["restart_s"] > 0 and failure["recovered_s"] >= failure["restart_s"]
            # ...losing at most the steps since its last complete checkpoint (period 10).
            assert 0 <= failure["steps_lost"] <= 20  # async: the newest save may be unfinished
        assert row["weights_equal"] and row["weights_equal_across_rows"]
        assert 0 < row["goodput"] < 1


def test_data_at_scale_json(quick_run):
    results = quick_run[1]
    sampler = results["sampler"]
    judged = [r for r in sampler["sampler"] if r["verdict"]]
    assert [r["kind"] for r in judged] == [
        "trainkit TrainingSampler",
        "trainkit worker share (1 of 2)",
    ]
    assert [r["verdict"] is not None for r in sampler["loader"]] == [True, False]
    memory = results["data_memory"]
    assert {r["mode"] for r in memory["rows"] if r["verdict"]} == {
        "shared (trainkit)",
        "shared, every rank builds",
    }
    metafile = results["metafile"]
    assert metafile["index_mb_per_s"] > 0 and metafile["baseline_mb_per_s"] > 0
    assert {r["kind"] for r in metafile["rows"] if r["verdict"]} == {"MetaFileDataset"}
    assert any(r["kind"].startswith("baseline") for r in metafile["rows"])


def test_train_json(quick_run):
    train = quick_run[1]["train"]
    assert sorted(train) == ["accum", "clf", "ddp", "default", "ema", "mlp"]
    for case in train.values():
        assert case["trainkit_s"] > 0 and case["plain_s"] > 0
        assert case["ratio"] == pytest.approx(case["trainkit_s"] / case["plain_s"])
        assert case["verdict"] in ("PASS", "MISS")


def test_data_json(quick_run):
    data = quick_run[1]["data"]
    assert {(r["workers"], r["kind"]) for r in data["throughput"]} == {
        (w, k)
        for w in (0, 2)
        for k in ("grouping on", "grouping on, no width/height", "grouping off")
    }
    sizes = data["grouping_sizes"]
    assert sizes["records"] > 0
    assert all(sizes[k] > 0 for k in ("sized_build_ms", "sized_read_us", "header_read_us"))
    assert sizes["verdict"] in ("PASS", "MISS")
    stream = data["stream"]
    assert stream["workers"] == 2 and stream["target"] == 0.95
    assert stream["ratio"] == pytest.approx(stream["rate"] / stream["torch_rate"])
    assert stream["verdict"] in ("PASS", "MISS")
    assert len(data["padding"]) == 5
    for row in data["padding"]:
        assert 0 <= row["padded_to_max"] <= row["padded_after_divisibility"] < 1
    # Two targets, then the per-image rescale comparison, which has none.
    assert [c["verdict"] in ("PASS", "MISS") for c in data["padding_checks"]] == [True, True, False]
    mixing = data["mixing"]
    assert [r["grouping"] for r in mixing["compose"]] == [False, True]
    for row in mixing["compose"]:
        # The median of each round's ratio (the two cases ran back to back in a round).
        samples = row["samples"]
        per_round = [m / p for m, p in zip(samples["mixed"], samples["plain"])]
        assert row["ratio"] == pytest.approx(median(per_round))
        assert row["mixed_us"] == pytest.approx(median(samples["mixed"]))
        assert row["verdict"] in ("PASS", "MISS")
    assert all(0 <= r["one_set"] < 1 and 0 <= r["mixed"] < 1 for r in mixing["padding"])


def test_mapper_json(quick_run):
    mapper = quick_run[1]["mapper"]
    assert mapper["baseline"] == "plain PIL/numpy" and mapper["images"] > 0
    assert mapper["trainkit_us"] > 0 and mapper["baseline_us"] > 0
    assert mapper["ratio"] == pytest.approx(mapper["baseline_us"] / mapper["trainkit_us"])
    assert mapper["target"] == 0.95 and mapper["verdict"] in ("PASS", "MISS")
    assert 0 < mapper["seeding_us"] <= mapper["context_us"]
    assert mapper["seeding_verdict"] in ("PASS", "MISS")


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


def test_the_package_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(task in proc.stdout for task in TASKS)


def test_import_cost_json(quick_run):
    cost = quick_run[1]["import_cost"]
    assert cost["torch_s"] > 0 and cost["engine_s"] > 0
    assert cost["ratio"] == pytest.approx(cost["engine_s"] / cost["torch_s"])
    assert cost["added_modules"]["trainkit"] > 10


def test_device_json(quick_run):
    device = quick_run[1]["device"]
    # --quick on the CPU: both models, eager only (compiling takes minutes there).
    assert sorted(device) == ["classifier/eager", "resnet50/eager"]
    for row in device.values():
        assert row["trainkit_s"] > 0 and row["plain_s"] > 0 and row["compiled"] is False
        assert row["ratio"] == row["trainkit_s"] / row["plain_s"]


def test_compile_json(quick_run):
    _, results = quick_run
    compile_ = results["compile"]
    assert compile_["backend"] == "aot_eager"  # --quick: traces, generates no code
    assert compile_["planned_training_graphs"] == 7
    # Every graph the first pass compiled is reused by the second: no recompile.
    assert compile_["graphs_after_second_pass"] == compile_["graphs_after_first_pass"]
    assert compile_["graph_breaks"] == 0


def test_fsdp_json(quick_run):
    fsdp = quick_run[1]["fsdp"]
    assert fsdp["world_size"] == 4 and fsdp["accumulate_steps"] == 2
    assert [len(fsdp["ranks"][s]) for s in ("ddp", "fsdp")] == [4, 4]
    for strategy in ("ddp", "fsdp"):
        after = fsdp["after_step"][strategy]
        assert sorted(after) == ["gradients", "optimizer", "parameters"]
        assert all(v > 0 for v in after.values())
        assert fsdp["total"][strategy] == sum(after.values())
        # The peak is sampled during the step whose end is the after-step figure.
        assert fsdp["peak_total"][strategy] >= fsdp["total"][strategy]
        assert fsdp["hwm"][strategy] > 0 and fsdp["step_s"][strategy] > 0
    assert fsdp["ratio"] == pytest.approx(fsdp["total"]["fsdp"] / fsdp["total"]["ddp"])
    assert fsdp["target"] == 0.3 and fsdp["verdict"] in ("PASS", "MISS")
    # DDP's buckets hold a copy of every gradient (gradient_as_bucket_view is off).
    assert fsdp["ddp_buckets"] == fsdp["after_step"]["ddp"]["gradients"]
    checks = fsdp["dry_run"]
    assert [(c["strategy"], c["figure"]) for c in checks] == [
        (s, f) for s in ("ddp", "fsdp") for f in ("parameters", "gradients", "optimizer", "total")
    ]
    for check in checks:
        assert check["ratio"] == pytest.approx(check["measured"] / check["dry_run"])
        assert check["verdict"] in ("PASS", "MISS")
