"""The dry run: the recipe auto-scaling makes, its refusals, and the records real ranks read.

A float64 regression model keeps a ledger of the record ids of each micro-batch it sees (as in
test_topology); the dry run's listing of the same steps must equal it, per rank and
micro-batch, for a fresh run and after a resume.
"""

import itertools
import json

import numpy as np
import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import ConfigError, get_cfg
from trainkit.config.scaling import SCALED_KEYS, auto_scale_config
from trainkit.data import DatasetCatalog
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, hooks, launch
from trainkit.utils import comm
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError
from trainkit.utils.events import get_event_storage

_NAME = "dry_run_test_train"
_W = torch.tensor([1.5, -2.0, 0.5, 3.0], dtype=torch.float64)


def _records(n=60):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, 4))
    sizes = rng.integers(20, 60, size=(n, 2))
    return [
        {"image_id": i, "x": x.tolist(), "y": float(x @ _W.numpy()), "width": int(w),
         "height": int(h)}
        for i, (x, (w, h)) in enumerate(zip(xs, sizes))
    ]  # fmt: skip


def _register():
    # In the test process and in each spawned rank (which imports this module afresh).
    if _NAME not in DatasetCatalog.list():
        DatasetCatalog.register(_NAME, _records)


@pytest.fixture(autouse=True)
def registered():
    _register()
    yield
    DatasetCatalog.remove(_NAME)


def _mapper(record):
    return {"id": record["image_id"], "x": torch.tensor(record["x"], dtype=torch.float64),
            "y": torch.tensor(record["y"], dtype=torch.float64)}  # fmt: skip


class _LedgerModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1).double()
        self.ledger = {}  # step -> the record ids of each micro-batch, in order

    def forward(self, batch):
        self.ledger.setdefault(get_event_storage().iter, []).append([b["id"] for b in batch])
        pred = self.linear(torch.stack([b["x"] for b in batch])).squeeze(1)
        return {"loss_mse": nn.functional.mse_loss(pred, torch.stack([b["y"] for b in batch]))}


class _Trainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _LedgerModel()

    @classmethod
    def build_train_loader(cls, cfg):
        from trainkit.data import build_train_loader

        return build_train_loader(cfg, mapper=_mapper)


class _StopAfter(hooks.HookBase):
    def __init__(self, step):
        self.step = step

    def after_step(self):
        if self.trainer.iter == self.step:
            raise KeyboardInterrupt


_OPTS = [
    "DATASETS.TRAIN", (_NAME,), "SEED", 5, "DATALOADER.NUM_WORKERS", 0,
    "DATALOADER.ASPECT_RATIO_GROUPING", True, "DATALOADER.ASPECT_RATIO_BINS", [0.8, 1.25],
    "SOLVER.IMS_PER_BATCH", 8, "SOLVER.BASE_LR", 0.02, "SOLVER.MAX_ITER", 10,
    "SOLVER.STEPS", (7,), "SOLVER.WARMUP_ITERS", 2, "SOLVER.CHECKPOINT_PERIOD", 3,
    "SOLVER.SCALE_MODE", "accumulate", "SOLVER.REFERENCE_WORLD_SIZE", 1,
    "SOLVER.ACCUMULATE_STEPS", 4, "WRITER_PERIOD", 100,
]  # fmt: skip


def _cfg(output_dir, opts=()):
    cfg = get_cfg()
    cfg.merge_from_list([*_OPTS, "OUTPUT_DIR", str(output_dir), *opts])
    return cfg


def _main(args):
    """A detectron2-style script's main: the dry run needs nothing more of it."""
    cfg = get_cfg()
    cfg.merge_from_list(args.opts)
    default_setup(cfg, args)
    raise AssertionError("default_setup returned: the dry run did not stop the script")


def _dry_run(tmp_path, flags, opts=()):
    """Run the dry run through launch() as a script does; return (exit status, JSON)."""
    path = tmp_path / "dry_run.json"
    args = default_argument_parser().parse_args(
        ["--dry-run-json", str(path), *flags]
        + [str(v) for v in (*_OPTS, "OUTPUT_DIR", tmp_path, *opts)]  # as typed
    )
    with pytest.raises(SystemExit) as stop:
        launch(_main, args.num_gpus, num_machines=args.num_machines, args=(args,))
    return stop.value.code, json.loads(path.read_text())


def _by_slot(report):
    return {(s["step"], s["rank"], s["micro_batch"]): s["record_ids"] for s in report["steps"]}


def _ids(ids):
    return [f"{_NAME}[{i}] image_id={i}" for i in ids]


@pytest.mark.parametrize("num_gpus, num_machines", [(2, 1), (64, 16)])
def test_the_recipe_is_auto_scale_configs_for_the_world_size(tmp_path, num_gpus, num_machines):
    world_size = num_gpus * num_machines
    opts = ["SOLVER.IMS_PER_BATCH", 2048] if world_size > 8 else []
    code, report = _dry_run(
        tmp_path, ["--num-gpus", str(num_gpus), "--num-machines", str(num_machines)], opts
    )
    assert code == 0 and report["refused"] == [] and report["world_size"] == world_size
    scaled = auto_scale_config(_cfg(tmp_path, opts), world_size)
    expected = {key: scaled[key.split(".")[0]][key.split(".")[1]] for key in SCALED_KEYS}
    assert report["recipe"] == {k: list(v) if isinstance(v, tuple) else v
                                for k, v in expected.items()}  # fmt: skip
    # accumulate: 4 micro-batches written for 1 process; 2 processes take 2 each, 1024 one.
    accumulate = 2 if world_size == 2 else 1
    assert report["recipe"]["SOLVER.ACCUMULATE_STEPS"] == accumulate
    batch = report["recipe"]["SOLVER.IMS_PER_BATCH"]
    assert report["micro_batch_size"] == batch // (world_size * accumulate)
    slots = _by_slot(report)
    assert len(slots) == 3 * world_size * accumulate  # --dry-run-steps defaults to 3
    for step in range(3):
        ids = [i for (s, _, _), ids in slots.items() if s == step for i in ids]
        assert len(ids) == batch  # each slot its share, the whole batch once per step
    assert not (tmp_path / "config.yaml").exists()  # a dry run writes nothing else


def test_what_auto_scaling_refuses_is_a_line_of_the_report(tmp_path, capsys):
    code, report = _dry_run(
        tmp_path, ["--num-gpus", "64", "--num-machines", "16"], ["SOLVER.SCALE_MODE", "linear"]
    )
    assert code == 2 and report["steps"] == []
    (reason,) = report["refused"]
    assert reason.startswith("auto_scale_workers: SOLVER.MAX_ITER=10, written for")
    assert f"Refused: {reason}\n" in capsys.readouterr().out


def test_a_config_error_stays_the_usual_error(tmp_path):
    with pytest.raises(ConfigError, match="SOLVER.IMS_PER_BATCH=8 is not a positive multiple"):
        _dry_run(tmp_path, ["--num-gpus", "3"], ["SOLVER.REFERENCE_WORLD_SIZE", 0])


def test_the_flags_are_checked(tmp_path):
    with pytest.raises(UsageError, match="--dry-run-steps must be >= 0"):
        _dry_run(tmp_path, ["--dry-run-steps", "-1"])


def _train(output_dir, stop_after=None, resume=False, opts=()):
    _register()
    seed_all_rng(1 + comm.get_rank())
    trainer = _Trainer(_cfg(output_dir, opts))  # scaled to the world size by the trainer
    if stop_after is not None:
        trainer.register_hooks([_StopAfter(stop_after)])
    trainer.resume_or_load(resume=resume)
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass
    model = trainer.model.module if hasattr(trainer.model, "module") else trainer.model
    return comm.all_gather(model.ledger)  # by rank


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "sharded-directory"])
def test_a_resumed_dry_run_starts_at_the_checkpoints_step(tmp_path, sharded):
    opts = ["MODEL.FSDP.ENABLED", True] if sharded else []
    (ledger,) = _train(tmp_path, stop_after=2, opts=opts)  # its checkpoint: after iteration 2
    code, report = _dry_run(tmp_path, ["--resume", "--dry-run-steps", "2"], opts)
    assert code == 0
    assert report["resume"]["checkpoint"].endswith("model_0000002" + ("" if sharded else ".pth"))
    assert report["resume"]["iteration"] == report["resume"]["step"] == 3
    _, fresh = _dry_run(tmp_path, ["--dry-run-steps", "5"])
    assert _by_slot(report) == {k: v for k, v in _by_slot(fresh).items() if k[0] >= 3}
    # The run itself read what the dry run lists for the steps it trained.
    assert {(s, 0, j): _ids(ids) for s, mbs in ledger.items() for j, ids in enumerate(mbs)} == {
        k: v for k, v in _by_slot(fresh).items() if k[0] <= 2
    }


@pytest.mark.slow
def test_the_listed_records_are_those_two_real_processes_read(tmp_path):
    stopped = run_on_ranks(_train, 2, args=(str(tmp_path), 5), timeout_s=180)[0]
    code, resumed_listing = _dry_run(
        tmp_path, ["--num-gpus", "2", "--resume", "--dry-run-steps", "4"]
    )
    assert code == 0 and resumed_listing["resume"]["step"] == 6
    resumed = run_on_ranks(_train, 2, args=(str(tmp_path), None, True), timeout_s=180)[0]
    _, listing = _dry_run(tmp_path, ["--num-gpus", "2", "--dry-run-steps", "6"])

    def read(ledgers):
        return {(step, rank, j): _ids(ids) for rank, ledger in enumerate(ledgers)
                for step, mbs in ledger.items() for j, ids in enumerate(mbs)}  # fmt: skip

    # 2 processes x 2 micro-batches (accumulate: 4 written for 1 process), steps 0-5, then
    # the resumed run's steps 6-9.
    assert read(stopped) == _by_slot(listing)
    assert read(resumed) == _by_slot(resumed_listing)
    assert sorted({k[0] for k in read(resumed)}) == [6, 7, 8, 9]


def test_a_straggler_rule_looser_than_documented_is_refused_as_a_real_run_would(tmp_path):
    with pytest.raises(ConfigError, match=r"STRAGGLER.MARGIN must be in \(0, 0.5\], got 0.9"):
        _dry_run(tmp_path, ["--num-gpus", "2"], ["STRAGGLER.MARGIN", "0.9"])


def test_a_mixed_dry_run_shows_each_steps_records_of_every_dataset(tmp_path, capsys):
    from trainkit.data.plans.mixed_sampler import mix_counts

    second = f"{_NAME}_b"
    DatasetCatalog.register(second, lambda: _records(30))
    try:
        mix = ["DATASETS.TRAIN", (_NAME, second), "DATASETS.TRAIN_WEIGHTS", (2, 1)]
        status, report = _dry_run(tmp_path, ["--num-gpus", "2", "--dry-run-steps", "4"], mix)
    finally:
        DatasetCatalog.remove(second)
    assert status == 0
    taken, expected = [0, 0], []
    for step in range(4):  # 8 records by 2 : 1 is 16/3 and 8/3 a step: (5, 3), (6, 2), ...
        counts = mix_counts(8, [2, 1], step, taken)
        taken = [t + c for t, c in zip(taken, counts)]
        expected.append({"step": step, "records": {_NAME: counts[0], second: counts[1]}})
    assert report["datasets"] == expected
    for entry in expected:  # the counts are those of the records listed for the step's slots
        slots = [slot for (s, _, _), slot in _by_slot(report).items() if s == entry["step"]]
        ids = [i for slot in slots for i in slot]
        assert sum(i.startswith(f"{second}[") for i in ids) == entry["records"][second]
    text = capsys.readouterr().out
    assert f"  step 1: {_NAME} 6, {second} 2\n" in text


# ---- LazyConfigs, stream datasets, and datasets too large to read ------------------------


def _listed_indices(report):
    """The dataset indices the report lists, from ids like ``NAME[i] image_id=...``."""
    ids = [i for slot in report["steps"] for i in slot["record_ids"]]
    return [int(i.split("[", 1)[1].split("]", 1)[0]) for i in ids]


def _lazy_cfg(**train):
    from omegaconf import OmegaConf

    from trainkit.config import LazyCall as L
    from trainkit.data import build_detection_train_loader, get_detection_dataset_dicts

    loader = L(build_detection_train_loader)(
        dataset=L(get_detection_dataset_dicts)(names=_NAME),
        mapper=L(_identity)(),
        total_batch_size=8,
        aspect_ratio_grouping=True,
        aspect_ratio_bins=[0.8, 1.25],
        num_workers=0,
        seed="${train.seed}",
        **train,
    )
    return OmegaConf.create(
        {"dataloader": {"train": loader}, "train": {"seed": 5, "max_iter": 10, "output_dir": ""}},
        flags={"allow_objects": True},
    )


class _identity:  # a mapper class a LazyConfig builds
    def __call__(self, record):
        return record["image_id"]


def test_a_lazyconfig_is_listed_from_its_loaders_arguments_without_building_it(capsys):
    from trainkit.config import instantiate
    from trainkit.engine.dry_run import dry_run, format_dry_run

    cfg = _lazy_cfg(accumulate_steps=2)
    report = dry_run(cfg, 2, num_steps=4)
    assert report["rescaled"] is False and report["refused"] == []
    assert report["recipe"] == {
        "dataloader.train.total_batch_size": 8,
        "dataloader.train.accumulate_steps": 2,
        "train.max_iter": 10,
    }
    assert (report["micro_batch_size"], report["accumulate_steps"]) == (2, 2)
    slots = _by_slot(report)
    assert len(slots) == 4 * 2 * 2  # steps x ranks x micro-batches
    # One process deals the same steps to 2 micro-batches of 4: the loader the LazyConfig
    # builds reads them.
    one = dry_run(cfg, 1, num_steps=4)
    loader = instantiate(cfg.dataloader.train)
    read = [batch for _, batch in zip(range(8), loader)]
    assert [[int(i.split("=")[1]) for i in s["record_ids"]] for s in one["steps"]] == read
    assert sorted(i for ids in slots.values() for i in ids) == sorted(
        i for s in one["steps"] for i in s["record_ids"]
    )
    text = format_dry_run(report, 2, 1)
    assert "Recipe (a LazyConfig is not rescaled to the world size: as written):" in text


def test_a_lazyconfigs_loader_spec_keeps_its_dataloader_arguments_and_nothing_else():
    from trainkit.config.run_config import run_config
    from trainkit.data.build import train_data_spec

    spec = train_data_spec(run_config(_lazy_cfg(timeout=30)), world_size=2, rank=1, seed=5)
    # The builder's ``**kwargs`` are unpacked, not passed on as an argument named "kwargs".
    assert dict(spec.loader.dataloader_kwargs) == {"timeout": 30}
    assert (spec.world_size, spec.rank, spec.loader.num_workers) == (2, 1, 0)


def test_a_lazyconfig_without_a_data_seed_is_not_listed():
    from trainkit.engine.dry_run import dry_run

    cfg = _lazy_cfg()
    cfg.train.seed = -1
    report = dry_run(cfg, 4)
    assert report["steps"] == [] and "SEED=-1" in report["notes"][0]


class _Stream(torch.utils.data.IterableDataset):
    """An endless stream of records; each loader worker reads every n-th one."""

    def __iter__(self):
        for i in itertools.count():
            yield {"image_id": i, "width": 10, "height": 10 + i % 3}


def test_a_stream_lists_what_its_loader_yields_with_the_configured_workers(tmp_path, capsys):
    from trainkit.data import build_train_loader
    from trainkit.engine.dry_run import dry_run, format_dry_run

    DatasetCatalog.register("dry_run_stream", _Stream)
    try:
        cfg = _cfg(tmp_path, ["DATASETS.TRAIN", ("dry_run_stream",), "DATALOADER.NUM_WORKERS", 2])
        report = dry_run(cfg, 1, num_steps=2)
        loader = build_train_loader(auto_scale_config(cfg, 1), mapper=lambda r: r["image_id"])
        read = [batch for _, batch in zip(range(8), loader)]
    finally:
        DatasetCatalog.remove("dry_run_stream")
    assert report["refused"] == [] and "stream dataset" in report["notes"][0]
    assert [(s["step"], s["micro_batch"]) for s in report["steps"]] == [
        (step, j) for step in range(2) for j in range(4)
    ]
    assert [s["worker"] for s in report["steps"]] == [0, 1] * 4  # the workers in turn
    assert [[int(i.split("=")[1]) for i in s["record_ids"]] for s in report["steps"]] == read
    assert "rank 0, micro-batch 1 (loader worker 1): image_id=" in format_dry_run(report, 1, 1)


class _Huge(torch.utils.data.Dataset):
    """4e8 records, made when read; every read is kept."""

    def __init__(self):
        self.reads = []

    def __len__(self):
        return 400_000_000

    def __getitem__(self, index):
        self.reads.append(index)
        return {"image_id": index, "width": 10 + index % 13, "height": 16}


@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_a_dry_run_of_a_len_4e8_dataset_reads_only_the_records_its_steps_draw(tmp_path, grouping):
    from trainkit.engine.dry_run import dry_run

    huge = _Huge()
    DatasetCatalog.register("dry_run_huge", lambda: huge)
    bins = [0.8, 1.25]
    try:
        opts = ["DATASETS.TRAIN", ("dry_run_huge",), "SOLVER.IMS_PER_BATCH", 16]
        opts += ["DATALOADER.ASPECT_RATIO_GROUPING", grouping, "DATALOADER.ASPECT_RATIO_BINS", bins]
        report = dry_run(_cfg(tmp_path, opts), 8, num_steps=3)
    finally:
        DatasetCatalog.remove("dry_run_huge")
    listed = _listed_indices(report)
    assert len(listed) == 3 * 16 and report["refused"] == []
    if not grouping:  # each listed record read once, for its id; nothing else
        assert sorted(huge.reads) == sorted(listed)
        return
    # Also each record the plan passed, for its bucket, and the first, checked when built:
    # the listed ones and those left waiting in buckets (fewer than a batch per bucket).
    assert set(listed) <= set(huge.reads)
    waiting = set(huge.reads) - set(listed) - {0}
    assert len(waiting) <= (len(bins) + 1) * (16 - 1)


def test_a_metadata_files_dry_run_reads_only_the_drawn_and_waiting_lines(tmp_path, monkeypatch):
    from tests.data.metafiles import write_jsonl
    from trainkit.data import MetaFileDataset
    from trainkit.engine.dry_run import dry_run

    meta = write_jsonl(tmp_path / "train.jsonl", 5000)
    MetaFileDataset(meta)  # the line index, built once
    lines = []
    original = MetaFileDataset.line

    def line(self, idx):
        lines.append(idx)
        return original(self, idx)

    monkeypatch.setattr(MetaFileDataset, "line", line)
    DatasetCatalog.register("dry_run_meta", lambda: MetaFileDataset(meta))
    try:
        opts = ["DATASETS.TRAIN", ("dry_run_meta",), "DATALOADER.ASPECT_RATIO_GROUPING", False]
        report = dry_run(_cfg(tmp_path, opts), 4, num_steps=3)
    finally:
        DatasetCatalog.remove("dry_run_meta")
    listed = _listed_indices(report)
    assert len(listed) == 3 * 8 and sorted(lines) == sorted(listed)
