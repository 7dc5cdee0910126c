"""The dry run's memory figures: the bytes a process holds under the configured strategy.

The figures are checked three ways: against hand-computed bytes of a Linear 10x7 with AdamW,
against ``state_bytes_per_process`` called here, and against what two real sharded
processes hold after their first optimizer step of the model and optimizer the same config
builds.
"""

import json
import re
import resource
import sys
import time
import types

import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from trainkit.engine.dry_run import dry_run, format_dry_run
from trainkit.modeling import META_ARCH_REGISTRY, shard_model, state_bytes_per_process
from trainkit.solver import build_optimizer

_DATA = "dry_run_memory_train"


class DryRunMemoryLinear(nn.Module):
    """A Linear 10x7: a weight of 7 rows (uneven over 2 and 4 processes) and a bias of 7."""

    def __init__(self, cfg):
        super().__init__()
        self.linear = nn.Linear(10, 7)


class DryRunMemoryBlocks(nn.Module):
    """Blocks of uneven dimension 0; the head's single row leaves one of 2 shards all padding."""

    block_modules = ("stem", "layers")

    def __init__(self, cfg):
        super().__init__()
        self.stem = nn.Linear(4, 7)
        self.layers = nn.ModuleList(nn.Linear(7, 7) for _ in range(2))
        self.head = nn.Linear(7, 1)

    def forward(self, batch):
        x, y = batch
        h = self.stem(x)
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return {"loss_mse": nn.functional.mse_loss(self.head(h).squeeze(1), y)}


class DryRunMemoryHuge(nn.Module):
    """About 1.07e9 parameters (4.3 GB in float32): only ever built on the meta device here."""

    built_on = []

    def __init__(self, cfg):
        super().__init__()
        self.linear = nn.Linear(32768, 32768)
        DryRunMemoryHuge.built_on.append(self.linear.weight.device.type)


# At import, so the ranks run_on_ranks spawns (which import this module afresh) have them.
for _arch in (DryRunMemoryLinear, DryRunMemoryBlocks, DryRunMemoryHuge):
    if _arch.__name__ not in META_ARCH_REGISTRY:
        META_ARCH_REGISTRY.register(_arch)


def _records():
    return [{"image_id": i, "width": 10, "height": 10} for i in range(32)]


@pytest.fixture(autouse=True)
def registered():
    DatasetCatalog.register(_DATA, _records)
    yield
    DatasetCatalog.remove(_DATA)


_OPTS = [
    "DATASETS.TRAIN", (_DATA,), "SEED", 1, "DATALOADER.NUM_WORKERS", 0,
    "DATALOADER.ASPECT_RATIO_GROUPING", False, "SOLVER.IMS_PER_BATCH", 8,
    "SOLVER.OPTIMIZER", "AdamW", "MODEL.META_ARCHITECTURE", "DryRunMemoryLinear",
]  # fmt: skip


def _cfg(opts=()):
    cfg = get_cfg()
    cfg.merge_from_list([*_OPTS, *opts])
    return cfg


def _fsdp(shard_size):
    return ["MODEL.FSDP.ENABLED", True, "MODEL.FSDP.SHARD_SIZE", shard_size]


def _main(args):
    cfg = get_cfg()
    cfg.merge_from_list(args.opts)
    default_setup(cfg, args)
    raise AssertionError("default_setup returned: the dry run did not stop the script")


def _dry_run(tmp_path, flags, opts=()):
    """Run the dry run through launch() as a script does; return (exit status, JSON)."""
    path = tmp_path / "dry_run.json"
    args = default_argument_parser().parse_args(
        ["--dry-run-json", str(path), "--dry-run-steps", "0", *flags]
        + [str(v) for v in (*_OPTS, "OUTPUT_DIR", tmp_path, *opts)]
    )
    with pytest.raises(SystemExit) as stop:
        launch(_main, args.num_gpus, num_machines=args.num_machines, args=(args,))
    return stop.value.code, json.loads(path.read_text())


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=0.1)


# Linear 10x7 in float32 with AdamW: weight 7x10, bias 7; AdamW keeps exp_avg and
# exp_avg_sq of each parameter's (shard's) shape and a float32 scalar step per parameter.
def _by_hand(rows):  # rows: the weight's and bias's dimension 0 on one process
    floats = rows * 10 + rows
    return {"parameters": 4 * floats, "gradients": 4 * floats, "optimizer": 2 * 4 * floats + 8}


_DDP = _by_hand(7)  # {"parameters": 308, "gradients": 308, "optimizer": 624}


@pytest.mark.parametrize(
    "flags, opts, strategy, shard_size, rows",
    [
        (["--num-gpus", "2"], [], "ddp", 1, 7),
        (["--num-gpus", "2"], _fsdp(0), "fsdp", 2, 4),  # 7 rows over 2: 4 each, 1 padding
        (["--num-gpus", "4"], _fsdp(0), "fsdp", 4, 2),  # 7 rows over 4: 2 each
        (["--num-gpus", "2", "--num-machines", "2"], _fsdp(4), "fsdp", 4, 2),  # 4: the world
        (["--num-gpus", "2", "--num-machines", "2"], _fsdp(2), "fsdp", 2, 4),  # hybrid 2 x 2
    ],
    ids=["ddp", "full-2", "full-4", "world-size", "hybrid"],
)
def test_the_json_holds_the_bytes_of_the_configured_strategy_beside_ddps(
    tmp_path, flags, opts, strategy, shard_size, rows
):
    code, report = _dry_run(tmp_path, flags, opts)
    assert code == 0 and report["refused"] == []
    memory = report["memory"]
    assert list(memory) == ["strategy", "shard_size", "per_process", "ddp_per_process"]
    assert (memory["strategy"], memory["shard_size"]) == (strategy, shard_size)
    for figures in (memory["per_process"], memory["ddp_per_process"]):
        assert list(figures) == ["parameters", "gradients", "optimizer"]
        assert all(type(v) is int for v in figures.values())
    assert memory["per_process"] == _by_hand(rows)
    assert memory["ddp_per_process"] == _DDP == {"parameters": 308, "gradients": 308,
                                                 "optimizer": 624}  # fmt: skip
    group = None if strategy == "ddp" else shard_size
    linear = nn.Linear(10, 7)
    assert memory["per_process"] == state_bytes_per_process(linear, _adamw, shard_group_size=group)
    assert memory["ddp_per_process"] == state_bytes_per_process(
        linear, _adamw, shard_group_size=None
    )


def test_the_text_shows_both_columns_and_says_activations_are_not_counted(tmp_path, capsys):
    _dry_run(tmp_path, ["--num-gpus", "2"], _fsdp(0))
    text = capsys.readouterr().out
    assert (
        "Memory per process sharded as configured, and under DDP: parameters, gradients and "
        "optimizer state after\n"
        "its first step (activations are not counted: this is not whether the job fits):\n"
        "               FSDP (2 shards)         DDP\n"
        "  parameters             176 B       308 B\n"
        "  gradients              176 B       308 B\n"
        "  optimizer              360 B       624 B\n"
        "  total                  712 B    1.21 KiB\n"
    ) in text


def test_a_shard_size_the_job_cannot_have_is_refused_in_one_line(tmp_path, capsys):
    # 4 divides the world (8) but not the 2 processes per machine: no hybrid group of 4.
    code, report = _dry_run(tmp_path, ["--num-gpus", "2", "--num-machines", "4"], _fsdp(4))
    assert code == 2 and report["memory"] is None
    (reason,) = report["refused"]
    assert reason == (
        "shard_model: MODEL.FSDP.SHARD_SIZE must be 0 or 8 (shard over all 8 processes) or a "
        "divisor > 1 of the 2 processes per machine (hybrid sharding), got 4; use one of those."
    )
    assert f"Refused: {reason}\n" in capsys.readouterr().out


class _OwnModelTrainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return nn.Linear(1, 1)


class _RegistryModelTrainer(DefaultTrainer):
    pass


@pytest.mark.parametrize("trainer", [_OwnModelTrainer, _RegistryModelTrainer])
def test_a_script_trainer_with_its_own_build_model_gets_one_line(
    tmp_path, capsys, monkeypatch, trainer
):
    script = types.ModuleType("__main__")  # the script: its trainer class, as train_net's
    script.Trainer, script.DefaultTrainer, script.Again = trainer, DefaultTrainer, trainer
    monkeypatch.setitem(sys.modules, "__main__", script)
    code, report = _dry_run(tmp_path, ["--num-gpus", "2"])
    line = (
        "memory: _OwnModelTrainer overrides build_model; the figures are for the registry's "
        "model (MODEL.META_ARCHITECTURE 'DryRunMemoryLinear'), not for the model the script's "
        "build_model makes"
    )
    assert code == 0 and report["memory"]["per_process"] == _DDP
    if trainer is _OwnModelTrainer:
        assert report["notes"] == [line]
        assert f"Note: {line}\n" in capsys.readouterr().out
    else:
        assert report["notes"] == []


class _Identity:  # a mapper class a LazyConfig builds
    def __call__(self, record):
        return record


def _lazy_cfg(fsdp):
    from omegaconf import OmegaConf

    from trainkit import model_zoo
    from trainkit.config import LazyCall as L
    from trainkit.data import build_detection_train_loader, get_detection_dataset_dicts

    loader = L(build_detection_train_loader)(
        dataset=L(get_detection_dataset_dicts)(names=_DATA),
        mapper=L(_Identity)(),
        total_batch_size=8,
        aspect_ratio_grouping=False,
        num_workers=0,
        seed=1,
    )
    train = {"seed": 1, "max_iter": 10, "output_dir": "", "fsdp": fsdp}
    return OmegaConf.create(
        {
            "dataloader": {"train": loader},
            "train": train,
            "model": L(nn.Linear)(in_features=10, out_features=7),
            "optimizer": model_zoo.get_config("common/optim.py").AdamW,
        },
        flags={"allow_objects": True},
    )


def test_a_lazyconfig_counts_its_model_and_optimizer_and_names_its_key():
    fsdp = {"enabled": True, "shard_size": 0, "reshard_after_forward": True}
    cfg = _lazy_cfg(fsdp)
    report = dry_run(cfg, 2, num_steps=0)
    assert report["refused"] == [] and report["notes"] == []
    assert report["memory"] == {
        "strategy": "fsdp",
        "shard_size": 2,
        "per_process": _by_hand(4),
        "ddp_per_process": _DDP,
    }
    assert "model" not in cfg.optimizer.params  # the script's config is left alone
    cfg.train.fsdp.shard_size = 3
    (reason,) = dry_run(cfg, 4, num_steps=0)["refused"]
    assert reason.startswith("shard_model: train.fsdp.shard_size must be 0 or 4 (shard over")
    del cfg.train.fsdp  # a LazyConfig written before train.fsdp: DDP
    assert dry_run(cfg, 2, num_steps=0)["memory"]["strategy"] == "ddp"


def test_a_model_of_1e9_parameters_is_counted_in_seconds_without_being_allocated():
    DryRunMemoryHuge.built_on.clear()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    cfg = _cfg(
        ["MODEL.META_ARCHITECTURE", "DryRunMemoryHuge", "SOLVER.IMS_PER_BATCH", 64, *_fsdp(0)]
    )
    report = dry_run(cfg, 64, num_steps=0, local_size=8)
    elapsed = time.perf_counter() - start
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert DryRunMemoryHuge.built_on == ["meta"]
    n = 32768 * 32768 + 32768  # weight and bias
    assert report["memory"]["ddp_per_process"]["parameters"] == 4 * n
    assert report["memory"]["ddp_per_process"]["optimizer"] == 8 * n + 8
    assert report["memory"]["per_process"]["parameters"] == 4 * n // 64
    assert elapsed < 5 and grown_mib < 200, (elapsed, grown_mib)
    assert re.search(r"\n  parameters +64.0 MiB +4.00 GiB\n", format_dry_run(report, 8, 8))


def _held_after_a_configured_step(opts):
    # A real sharded process of the job the config describes: the registry's model sharded
    # with shard_model, the configured optimizer stepped once; then the distinct storages of
    # its parameter shards, their gradients and the optimizer's state, each counted once.
    from trainkit.modeling import build_model

    cfg = _cfg(opts)
    torch.manual_seed(0)
    model = shard_model(build_model(cfg), shard_size=cfg.MODEL.FSDP.SHARD_SIZE)
    optimizer = build_optimizer(cfg, model)
    g = torch.Generator().manual_seed(0)
    model((torch.randn(4, 4, generator=g), torch.randn(4, generator=g)))["loss_mse"].backward()
    optimizer.step()

    def held(tensors):
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        storages = {s.data_ptr(): s for s in (t.untyped_storage() for t in local)}
        return sum(s.nbytes() for s in storages.values())

    params = list(model.parameters())
    return {
        "parameters": held(params),
        "gradients": held(p.grad for p in params),
        "optimizer": held(v for state in optimizer.state.values() for v in state.values()),
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_the_figures_are_the_largest_that_two_real_sharded_processes_hold():
    opts = ["MODEL.META_ARCHITECTURE", "DryRunMemoryBlocks", *_fsdp(0)]
    report = dry_run(_cfg(opts), 2, num_steps=0)
    held = run_on_ranks(_held_after_a_configured_step, 2, args=(opts,), timeout_s=300)
    # Rank 1's optimizer state of a 7-row parameter has 3 rows, of the 1-row head none (its
    # parameter and gradient shards are padded to rank 0's 4 and 1 rows).
    assert held[0]["optimizer"] > held[1]["optimizer"]
    per_process = report["memory"]["per_process"]
    assert per_process == {key: max(h[key] for h in held) for key in per_process}, held
    assert per_process["parameters"] < report["memory"]["ddp_per_process"]["parameters"]
