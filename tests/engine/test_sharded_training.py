"""DefaultTrainer with MODEL.FSDP.ENABLED: what composes with a sharded model, on Gloo processes.

The regression task of ``test_default_trainer`` (a model of two Linear blocks, an MSE
evaluator that returns results on rank 0 only) is trained sharded: evaluation and validation
losses with unequal test batches per rank, the EMA of the shards, the best checkpoint saved by
every rank, a rank-0-only checkpointing hook refused, a save killed inside DCP's storage
writer, each block compiled, and a sharded directory evaluated on one process.
"""

import os
import signal
import time

import pytest
import torch

from tests.dist import run_on_ranks
from tests.engine.test_default_trainer import RegressionTrainer, _cfg
from trainkit.checkpoint import Checkpointer, is_sharded
from trainkit.config import ConfigError
from trainkit.data import build_batch_data_loader
from trainkit.data.common import DatasetFromList, MapDataset
from trainkit.data.samplers import InferenceSampler
from trainkit.engine import hooks
from trainkit.engine.step_config import prepare_model
from trainkit.modeling import model_blocks
from trainkit.utils import comm
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError

pytestmark = pytest.mark.distributed


class _UnevenTestTrainer(RegressionTrainer):
    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        # 25 records, 8 a batch: rank 0 of 3 runs 2 batches (9 records), ranks 1 and 2 one.
        records = [{"x": [0.1 * i] * 4, "y": float(i)} for i in range(25)]
        data = MapDataset(
            DatasetFromList(records),
            lambda r: {"x": torch.tensor(r["x"]), "y": torch.tensor(r["y"])},
        )
        per_rank = 8 * comm.get_world_size()  # the total over ranks, 8 a rank
        return build_batch_data_loader(
            data, InferenceSampler(len(records)), per_rank, drop_last=False
        )


def _sharded_cfg(output_dir, **opts):
    cfg = _cfg(output_dir, max_iter=opts.pop("max_iter", 6), workers=0)
    cfg.MODEL.FSDP.ENABLED = True
    cfg.SOLVER.CHECKPOINT_PERIOD = 3
    cfg.TEST.EVAL_PERIOD = 3
    for key, value in opts.items():
        node = cfg
        *path, leaf = key.split("__")
        for name in path:
            node = getattr(node, name)
        setattr(node, leaf, value)
    return cfg


def _evaluate_unequal_batches(output_dir):
    seed_all_rng(7 + comm.get_rank())
    cfg = _sharded_cfg(output_dir, TEST__VAL_LOSS=True, SOLVER__IMS_PER_BATCH=12)
    trainer = _UnevenTestTrainer(cfg)
    trainer.train()
    return trainer.storage.latest().get("validation/loss_mse"), trainer._last_eval_results


@pytest.mark.slow
def test_evaluation_and_validation_losses_run_unequal_batches_on_three_processes(tmp_path):
    results = run_on_ranks(_evaluate_unequal_batches, 3, args=(str(tmp_path),), timeout_s=240)
    (val_loss, _), evaluated = results[0], results[0][1]
    assert val_loss is not None and val_loss[0] > 0
    assert evaluated["regression"]["mse"] > 0


def _train_with_best(output_dir, rank0_only_hook):
    seed_all_rng(7 + comm.get_rank())
    cfg = _sharded_cfg(output_dir, SOLVER__CHECKPOINT_ASYNC=True, MODEL_EMA__ENABLED=True)
    trainer = RegressionTrainer(cfg)
    # The evaluator returns its MSE on rank 0 only: rank 0's decision must reach rank 1.
    best = hooks.BestCheckpointer(3, trainer.checkpointer, "regression/mse", mode="min")
    if rank0_only_hook and comm.is_main_process():  # detectron2's build_hooks way
        trainer.register_hooks([hooks.PeriodicCheckpointer(trainer.checkpointer, 2)])
    trainer.register_hooks([best])
    try:
        trainer.train()
    except UsageError as e:
        return str(e)
    ema = {k: v.full_tensor() for k, v in trainer.model_ema._get_averaged().tensors.items()}
    return sorted(os.listdir(output_dir)), ema


def _train_ddp_ema(output_dir):
    seed_all_rng(7 + comm.get_rank())
    cfg = _cfg(output_dir, max_iter=6, workers=0)
    cfg.MODEL_EMA.ENABLED, cfg.SOLVER.CHECKPOINT_PERIOD, cfg.TEST.EVAL_PERIOD = True, 3, 3
    trainer = RegressionTrainer(cfg)
    trainer.train()
    return dict(trainer.model_ema.ema_model.state_dict())


@pytest.mark.slow
def test_best_checkpoint_async_saves_and_the_shards_ema_on_two_processes(tmp_path):
    files, ema = run_on_ranks(
        _train_with_best, 2, args=(str(tmp_path / "fsdp"), False), timeout_s=240
    )[0]
    assert {"model_best", "model_0000002", "model_0000005", "model_final"} <= set(files)
    assert not [name for name in files if name.startswith(".")]
    assert os.path.isfile(tmp_path / "fsdp" / "model_best" / ".metadata")
    reference = run_on_ranks(_train_ddp_ema, 2, args=(str(tmp_path / "ddp"),), timeout_s=240)[0]
    for name, value in reference.items():
        if name in ema:
            torch.testing.assert_close(ema[name], value, rtol=1e-5, atol=1e-6)


def test_a_checkpointing_hook_on_rank_0_only_is_refused_before_training(tmp_path):
    messages = run_on_ranks(_train_with_best, 2, args=(str(tmp_path), True), timeout_s=240)
    for message in messages:  # every rank stops, in one line naming the hook
        assert isinstance(message, str) and "\n" not in message
        assert message.startswith("PeriodicCheckpointer is registered on rank(s) [0] only")


def test_ema_for_evaluation_is_refused_at_start_with_fsdp(tmp_path):
    cfg = _sharded_cfg(str(tmp_path), MODEL_EMA__ENABLED=True, MODEL_EMA__USE_FOR_EVAL=True)
    with pytest.raises(ConfigError, match="MODEL_EMA.USE_FOR_EVAL cannot be used with MODEL.FSDP"):
        RegressionTrainer(cfg)


def _killed_mid_save(output_dir):
    from torch.distributed.checkpoint import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def dies_at_the_second_save(self, plan, planner):
        if "model_0000005" in str(self.path):
            os._exit(3)  # as a kill would, inside the storage writer
        return write_data(self, plan, planner)

    FileSystemWriter.write_data = dies_at_the_second_save
    seed_all_rng(7 + comm.get_rank())
    RegressionTrainer(_sharded_cfg(output_dir, TEST__EVAL_PERIOD=0)).train()


def _resume(output_dir, resume):
    seed_all_rng(7 + comm.get_rank())
    trainer = RegressionTrainer(_sharded_cfg(output_dir, TEST__EVAL_PERIOD=0))
    trainer.resume_or_load(resume=resume)
    start = trainer.start_iter
    trainer.train()
    return start, {k: v.full_tensor() for k, v in trainer.model.state_dict().items()}


@pytest.mark.slow
def test_a_save_killed_in_the_storage_writer_resumes_from_the_previous_checkpoint(tmp_path):
    out = str(tmp_path / "killed")
    with pytest.raises(Exception):  # noqa: B017 - the processes died: whatever the launcher says
        run_on_ranks(_killed_mid_save, 2, args=(out,), timeout_s=120)
    with open(os.path.join(out, "last_checkpoint")) as f:
        assert f.read() == "model_0000002"
    assert not os.path.exists(os.path.join(out, "model_0000005"))
    start, resumed = run_on_ranks(_resume, 2, args=(out, True), timeout_s=240)[0]
    assert start == 3
    _, straight = run_on_ranks(_resume, 2, args=(str(tmp_path / "straight"), False), timeout_s=240)[
        0
    ]
    for name, value in straight.items():
        assert torch.equal(value, resumed[name]), name


def test_each_block_is_compiled_before_sharding_on_one_process(tmp_path):
    cfg = _sharded_cfg(str(tmp_path), max_iter=2, MODEL__COMPILE__ENABLED=True)
    cfg.MODEL.COMPILE.BACKEND = "eager"
    cfg.TEST.EVAL_PERIOD = 0
    trainer = RegressionTrainer(cfg)
    assert is_sharded(trainer.model)
    assert all(block._compiled_call_impl is not None for block in model_blocks(trainer.model))
    trainer.train()
    assert os.path.isdir(tmp_path / "model_final")


def _train_for_eval(output_dir):
    seed_all_rng(7 + comm.get_rank())
    trainer = RegressionTrainer(_sharded_cfg(output_dir, TEST__EVAL_PERIOD=0))
    return trainer.train()


@pytest.mark.slow
def test_one_process_evaluates_a_sharded_directory_whole_and_sharded(tmp_path):
    out = str(tmp_path)
    trained = run_on_ranks(_train_for_eval, 2, args=(out,), timeout_s=240)[0]
    cfg = _sharded_cfg(out)
    # --eval-only's way with DefaultTrainer.build_model: sharded (one process), resharded.
    sharded = prepare_model(cfg, RegressionTrainer.build_model(cfg))
    Checkpointer(sharded).load(os.path.join(out, "model_final"))
    assert is_sharded(sharded)
    assert RegressionTrainer.test(cfg, sharded) == trained
    # DefaultPredictor's way: the whole model, the directory read whole.
    whole = RegressionTrainer.build_model(_cfg(out, workers=0))
    Checkpointer(whole).load(os.path.join(out, "model_final"))
    assert not is_sharded(whole)
    assert RegressionTrainer.test(cfg, whole) == trained


class _SlowFirstBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 16)

    def forward(self, x):
        if comm.get_rank() == 1:
            time.sleep(0.03)  # rank 1 computes slowly; rank 0 waits in the next block's gather
        return self.layer(x)


class _TwoBlockModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = _SlowFirstBlock(), torch.nn.Linear(16, 1)

    def forward(self, batch):
        pred = self.second(self.first(torch.stack([b["x"] for b in batch]))).squeeze(1)
        if not self.training:
            return pred
        y = torch.stack([b["y"] for b in batch])
        return {"loss_mse": torch.nn.functional.mse_loss(pred, y)}


class _SlowRankTrainer(RegressionTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _TwoBlockModel()


def _train_with_a_slow_rank(output_dir):
    seed_all_rng(7 + comm.get_rank())
    cfg = _sharded_cfg(output_dir, max_iter=25, TEST__EVAL_PERIOD=0, WRITER_PERIOD=5)
    cfg.SOLVER.CHECKPOINT_PERIOD = 1000
    trainer = _SlowRankTrainer(cfg)
    trainer.train()
    return trainer.storage.latest().get("straggler/rank")


@pytest.mark.slow
def test_the_wait_in_fsdps_gathers_is_collective_so_the_slow_rank_is_named(tmp_path):
    named = run_on_ranks(_train_with_a_slow_rank, 2, args=(str(tmp_path),), timeout_s=240)[0]
    assert named is not None and named[0] == 1  # rank 1, found from its own work


class _NanAtStep(RegressionTrainer):
    """The regression model, whose loss is NaN at step 4."""

    @classmethod
    def build_model(cls, cfg):
        model = super().build_model(cfg)
        forward, calls = model.forward, iter(range(10**6))

        def nan_at_4(batch):
            out = forward(batch)
            if model.training and next(calls) == 4:
                out = {k: v * float("nan") for k, v in out.items()}
            return out

        model.forward = nan_at_4
        return model


def test_a_deferred_non_finite_loss_is_named_and_no_checkpoint_holds_it(tmp_path):
    from trainkit.engine.step_metrics import NonFiniteLossError

    cfg = _sharded_cfg(str(tmp_path), TEST__EVAL_PERIOD=0, SOLVER__DEFERRED_CHECKS=True)
    cfg.SOLVER.CHECKPOINT_PERIOD, cfg.WRITER_PERIOD = 3, 10
    with pytest.raises(NonFiniteLossError, match="iteration=4"):
        _NanAtStep(cfg).train()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("model_")) == ["model_0000002"]


def test_a_preempted_sharded_run_saves_its_directory_and_resumes(tmp_path):
    import signal

    from trainkit.engine.hooks.preemption import TrainingPreempted

    class _SignalAt(hooks.HookBase):
        def after_step(self):
            if self.trainer.iter == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    cfg = _sharded_cfg(str(tmp_path), TEST__EVAL_PERIOD=0)
    cfg.SOLVER.CHECKPOINT_PERIOD = 100
    trainer = RegressionTrainer(cfg)
    trainer._hooks.insert(0, _SignalAt())  # before the PreemptionHandler's check
    trainer._hooks[0].trainer = trainer
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(TrainingPreempted) as e:
            trainer.train()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert e.value.iteration == 3 and str(tmp_path / "model_0000003") in str(e.value)
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000003"
    resumed = RegressionTrainer(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 4
    resumed.train()
    assert os.path.isdir(tmp_path / "model_final")


def test_max_to_keep_rotates_directories_and_a_predictor_reads_one_whole(tmp_path):
    from tests.engine.test_predictor import _cfg as _image_cfg
    from trainkit.engine import DefaultPredictor, DefaultTrainer

    cfg = _image_cfg()
    cfg.defrost()
    cfg.OUTPUT_DIR, cfg.MODEL.FSDP.ENABLED = str(tmp_path), True
    cfg.SOLVER.MAX_ITER, cfg.SOLVER.CHECKPOINT_PERIOD, cfg.SOLVER.MAX_TO_KEEP = 4, 1, 2
    cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_WORKERS, cfg.TEST.EVAL_PERIOD = 4, 0, 0
    cfg.DATASETS.TRAIN, cfg.DATASETS.TEST = ("shapes_minival",), ()
    cfg.INPUT.MAX_SIZE_TRAIN, cfg.MODEL.CLASSIFIER.CHANNELS = 32, [4, 8]
    trainer = DefaultTrainer(cfg)
    trainer.train()
    kept = sorted(n for n in os.listdir(tmp_path) if n.startswith("model_"))
    assert kept == ["model_0000002", "model_0000003", "model_final"]
    state = trainer.model.state_dict()
    whole = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    cfg.MODEL.WEIGHTS = str(tmp_path / "model_final")
    predictor = DefaultPredictor(cfg)  # the whole model, on one process, without FSDP
    assert not is_sharded(predictor.model)
    for name, value in predictor.model.state_dict().items():
        assert torch.equal(value, whole[name]), name
    image = torch.randint(0, 255, (40, 48, 3), dtype=torch.uint8).numpy()
    assert predictor(image) is not None


def test_a_sharded_directory_is_accepted_as_model_weights_at_set_up(tmp_path):
    from trainkit.config.run_config import run_config
    from trainkit.utils.errors import MissingFileError

    cfg = _sharded_cfg(str(tmp_path))
    cfg.MODEL.WEIGHTS = str(tmp_path / "model_final")
    with pytest.raises(MissingFileError, match="MODEL.WEIGHTS file not found"):
        run_config(cfg).check_weights(eval_only=True, resume=False)
    os.makedirs(tmp_path / "model_final")
    run_config(cfg).check_weights(eval_only=True, resume=False)  # a directory is a checkpoint


def test_model_weights_load_into_a_sharded_model_under_the_same_rules(tmp_path):
    from tests.engine.test_default_trainer import RegressionModel
    from trainkit.checkpoint import ShapeMismatchError
    from trainkit.modeling import shard_model

    torch.manual_seed(0)
    source = RegressionModel()
    state = {f"module.{k}": v for k, v in source.state_dict().items()}  # a DDP wrapper's names
    state["module.out.weight"] = torch.zeros(2, 16)  # another head: a shape mismatch
    torch.save({"model": state}, tmp_path / "weights.pth")
    sharded = shard_model(RegressionModel())
    with pytest.raises(ShapeMismatchError, match="out.weight"):
        Checkpointer(sharded, allow_shape_mismatch=False).load(str(tmp_path / "weights.pth"))
    Checkpointer(sharded, allow_shape_mismatch=True).load(str(tmp_path / "weights.pth"))
    loaded = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    assert torch.equal(loaded["hidden.weight"], source.hidden.weight)
    assert not torch.equal(loaded["out.weight"], source.out.weight)  # skipped, as initialised

    class _Renaming(Checkpointer):  # a project's DetectionCheckpointer subclass
        def _load_model(self, checkpoint):
            checkpoint["model"] = {
                k.replace("module.first.", "module.hidden."): v
                for k, v in checkpoint["model"].items()
            }
            return super()._load_model(checkpoint)

    renamed = {k.replace("hidden.", "first."): v for k, v in state.items()}
    torch.save({"model": renamed}, tmp_path / "renamed.pth")
    other = shard_model(RegressionModel())
    _Renaming(other, allow_shape_mismatch=True).load(str(tmp_path / "renamed.pth"))
    assert torch.equal(other.state_dict()["hidden.weight"].full_tensor(), source.hidden.weight)


def test_the_ema_of_a_sharded_run_loads_from_its_directory(tmp_path):
    from tests.engine.test_default_trainer import RegressionModel
    from trainkit.engine.hooks import load_ema_weights

    cfg = _sharded_cfg(str(tmp_path), max_iter=3, TEST__EVAL_PERIOD=0, MODEL_EMA__ENABLED=True)
    trainer = RegressionTrainer(cfg)
    trainer.train()
    averaged = trainer.model_ema._get_averaged().tensors
    whole = RegressionModel()
    assert load_ema_weights(whole, str(tmp_path / "model_final"))
    for name, value in whole.state_dict().items():
        expected = averaged[name]
        expected = expected.full_tensor() if hasattr(expected, "full_tensor") else expected
        assert torch.equal(value, expected), name


class _KillAt(hooks.HookBase):
    def __init__(self, iteration):
        self.iteration = iteration

    def after_step(self):
        if self.trainer.iter == self.iteration:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no save, no goodbye


def _compiled_deferred_crash_once(output_dir):
    from trainkit.launcher.restarts import restart_count

    seed_all_rng(7 + comm.get_rank())
    cfg = _sharded_cfg(output_dir, max_iter=8, TEST__EVAL_PERIOD=0, SOLVER__DEFERRED_CHECKS=True)
    cfg.MODEL.COMPILE.ENABLED, cfg.MODEL.COMPILE.BACKEND = True, "eager"
    trainer = RegressionTrainer(cfg)
    if restart_count() == 0 and comm.get_rank() == 1:
        trainer.register_hooks([_KillAt(6)])  # past the checkpoint of iteration 5
    trainer.resume_or_load(resume=False)  # a restarted job resumes by itself
    start = trainer.start_iter
    trainer.train()
    compiled = all(b._compiled_call_impl is not None for b in model_blocks(trainer.model))
    return start, compiled, {k: v.full_tensor() for k, v in trainer.model.state_dict().items()}


def _straight_compiled(output_dir):
    seed_all_rng(7 + comm.get_rank())
    cfg = _sharded_cfg(output_dir, max_iter=8, TEST__EVAL_PERIOD=0, SOLVER__DEFERRED_CHECKS=True)
    cfg.MODEL.COMPILE.ENABLED, cfg.MODEL.COMPILE.BACKEND = True, "eager"
    trainer = RegressionTrainer(cfg)
    trainer.train()
    return {k: v.full_tensor() for k, v in trainer.model.state_dict().items()}


@pytest.mark.slow
def test_compiled_blocks_deferred_checks_and_a_restart_after_a_crash_on_two_processes(tmp_path):
    restarted = run_on_ranks(
        _compiled_deferred_crash_once, 2, args=(str(tmp_path / "b"),), max_restarts=1,
        timeout_s=300,
    )  # fmt: skip
    assert [(start, compiled) for start, compiled, _ in restarted] == [(6, True), (6, True)]
    straight = run_on_ranks(_straight_compiled, 2, args=(str(tmp_path / "a"),), timeout_s=300)[0]
    for name, value in straight.items():  # the restarted run ends where the straight one does
        assert torch.equal(value, restarted[0][2][name]), name


def _preempted_on_rank_1(output_dir):
    from trainkit.engine.hooks.preemption import TrainingPreempted

    class _SignalAt(hooks.HookBase):
        def after_step(self):
            if self.trainer.iter == 3 and comm.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    seed_all_rng(7 + comm.get_rank())
    trainer = RegressionTrainer(_sharded_cfg(output_dir, TEST__EVAL_PERIOD=0))
    trainer._hooks.insert(0, _SignalAt())  # before the PreemptionHandler's check
    trainer._hooks[0].trainer = trainer
    try:
        trainer.train()
    except TrainingPreempted as e:
        return e.iteration
    return None


@pytest.mark.slow
def test_a_signal_on_one_rank_saves_every_ranks_shards_and_stops_both(tmp_path):
    stopped = run_on_ranks(_preempted_on_rank_1, 2, args=(str(tmp_path),), timeout_s=300)
    assert stopped[0] == stopped[1] >= 3  # the ranks agree on the step to stop after
    name = f"model_{stopped[0]:07d}"
    assert (tmp_path / "last_checkpoint").read_text() == name
    names = {p.name for p in (tmp_path / name).iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "run.pth"} <= names
