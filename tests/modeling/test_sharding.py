"""A model sharded with FSDP2 block by block: its blocks, mesh, activation checkpointing, and
training on real Gloo processes against the same steps unsharded."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.checkpoint import is_sharded
from trainkit.config import ConfigError
from trainkit.engine import SimpleTrainer
from trainkit.engine.gradients import ShardedGradients
from trainkit.modeling.sharding import (
    checkpoint_activations,
    hybrid_mesh_shape,
    model_blocks,
    shard_model,
)


class Blocks(nn.Module):
    """A stem, a ModuleList of blocks and a head, with dropout (RNG in the recomputation)."""

    block_modules = ("stem", "layers")

    def __init__(self, width=8, depth=3, dropout=0.1):
        super().__init__()
        self.stem = nn.Linear(4, width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, batch):
        x, y = batch
        h = self.stem(x)
        for layer in self.layers:
            h = h + layer(h)
        return {"loss": nn.functional.mse_loss(self.head(h).squeeze(1), y)}


class Undeclared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.act = nn.ReLU()  # no parameters: not a block
        self.b = nn.Linear(2, 1)


def test_declared_blocks_expand_module_lists_and_undeclared_ones_are_the_children():
    model = Blocks()
    assert model_blocks(model) == [model.stem, *model.layers]
    plain = Undeclared()
    assert model_blocks(plain) == [plain.a, plain.b]


def test_a_block_name_that_is_not_a_submodule_is_named():
    class Wrong(Blocks):
        block_modules = ("stem", "blocks")

    with pytest.raises(ValueError, match=r"Wrong.block_modules names 'blocks'"):
        model_blocks(Wrong())


@pytest.mark.parametrize(
    ("shard_size", "world", "local", "shape"),
    [(0, 2, 2, (2,)), (2, 2, 2, (2,)), (2, 4, 4, (2, 2)), (2, 4, 2, (2, 2)), (4, 8, 4, (2, 4))],
)
def test_the_mesh_is_flat_or_hybrid(shard_size, world, local, shape):
    assert hybrid_mesh_shape(shard_size, world, local) == shape


@pytest.mark.parametrize(("shard_size", "local"), [(1, 4), (3, 4), (-2, 4), (8, 4), (2, 1)])
def test_a_shard_size_that_does_not_divide_is_one_line_naming_what_is_allowed(shard_size, local):
    with pytest.raises(ConfigError, match=r"shard_size must be 0 or 4 \(shard over all 4") as e:
        hybrid_mesh_shape(shard_size, 4, local)
    assert "\n" not in str(e.value) and f"got {shard_size}" in str(e.value)


def _batch(seed=0, n=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randn(n, generator=g)


def test_activation_checkpointing_keeps_the_losses_gradients_and_state_dict_keys():
    torch.manual_seed(0)
    model = Blocks()
    recomputed = copy.deepcopy(model)
    checkpoint_activations(model_blocks(recomputed))
    assert list(recomputed.state_dict()) == list(model.state_dict())
    batch = _batch()
    torch.manual_seed(1)
    model(batch)["loss"].backward()
    torch.manual_seed(1)
    recomputed(batch)["loss"].backward()  # dropout: the recomputation draws the same masks
    for p, q in zip(model.parameters(), recomputed.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


def _train_sharded(shard_size, accumulate, steps, checkpointing):
    # Every rank trains a copy of the same model on its share of each step's records; the
    # reference trains one unsharded copy on all of them, so the weights must agree.
    import torch.distributed as dist

    from trainkit.utils import comm

    rank, world = comm.get_rank(), comm.get_world_size()
    torch.manual_seed(0)
    model = Blocks(dropout=0.0)  # the ranks' batches and the reference's draw differently
    reference = copy.deepcopy(model)
    sharded = shard_model(model, shard_size=shard_size, activation_checkpointing=checkpointing)
    assert is_sharded(sharded) and not is_sharded(reference)
    n = 4 * world * accumulate
    batches = [_batch(seed=s, n=n) for s in range(steps)]
    per_rank = [
        (x[rank::world][j::accumulate], y[rank::world][j::accumulate])
        for x, y in batches
        for j in range(accumulate)
    ]
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1, momentum=0.9)
    step = SimpleTrainer(sharded, per_rank, optimizer, accumulate_steps=accumulate)
    assert isinstance(step.gradient_combiner, ShardedGradients)
    step.train(0, steps)
    # No process ever held a full gradient: each is this rank's shard of dimension 0.
    shard_rows = [p.grad.to_local().shape[0] for p in sharded.parameters() if p.ndim == 2]
    full_rows = [p.shape[0] for p in reference.parameters() if p.ndim == 2]
    mesh_shard = world if shard_size in (0, world) else shard_size
    assert all(s <= -(-f // mesh_shard) for s, f in zip(shard_rows, full_rows))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        ref_opt.zero_grad()
        reference((x, y))["loss"].backward()
        ref_opt.step()
    full = {name: p.full_tensor() for name, p in sharded.named_parameters()}
    dist.barrier()
    return {name: (full[name] - p).abs().max().item() for name, p in reference.named_parameters()}


@pytest.mark.parametrize(
    ("world", "shard_size", "accumulate", "checkpointing"),
    [
        pytest.param(2, 0, 1, False, marks=pytest.mark.slow),  # the next one covers it
        (2, 0, 2, True),
        pytest.param(4, 2, 2, False, marks=pytest.mark.slow),  # 4 processes
    ],
    ids=["full-2", "full-2-accumulate-checkpointed", "hybrid-2x2-accumulate"],
)
def test_sharded_training_matches_the_unsharded_steps(world, shard_size, accumulate, checkpointing):
    results = run_on_ranks(
        _train_sharded, world, args=(shard_size, accumulate, 3, checkpointing), timeout_s=120
    )
    for errors in results:
        assert max(errors.values()) < 1e-5, errors


def test_one_process_without_a_process_group_still_shards():
    code = (
        "import torch, torch.distributed as dist\n"
        "from tests.modeling.test_sharding import Blocks\n"
        "from trainkit.checkpoint import is_sharded\n"
        "from trainkit.modeling import shard_model\n"
        "model = shard_model(Blocks())\n"
        "assert dist.is_initialized() and dist.get_world_size() == 1 and is_sharded(model)\n"
        "model((torch.ones(2, 4), torch.ones(2)))['loss'].backward()\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=root,
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_built_in_classifier_declares_its_stages():
    from trainkit.config import get_cfg
    from trainkit.modeling import build_model

    model = build_model(get_cfg())
    assert model_blocks(model) == list(model.stages)


def _train_clipped(clip_type):
    # SOLVER.CLIP_GRADIENTS through build_optimizer: torch's clipping reads the DTensor
    # gradients' norms over every shard, so the sharded steps equal the unsharded ones.
    from trainkit.config import get_cfg
    from trainkit.solver import build_optimizer
    from trainkit.utils import comm

    cfg = get_cfg()
    cfg.SOLVER.BASE_LR, cfg.SOLVER.MOMENTUM, cfg.SOLVER.WEIGHT_DECAY = 0.5, 0.9, 0.0
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = clip_type
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 0.05  # small: every step is clipped
    rank, world = comm.get_rank(), comm.get_world_size()
    torch.manual_seed(0)
    reference = Blocks(dropout=0.0)
    sharded = shard_model(copy.deepcopy(reference))
    batches = [_batch(seed=s, n=8) for s in range(3)]
    per_rank = [(x[rank::world], y[rank::world]) for x, y in batches]
    SimpleTrainer(sharded, per_rank, build_optimizer(cfg, sharded)).train(0, 3)
    ref_opt = build_optimizer(cfg, reference)
    for batch in batches:
        ref_opt.zero_grad()
        reference(batch)["loss"].backward()
        ref_opt.step()
    full = {name: p.full_tensor() for name, p in sharded.named_parameters()}
    return max((full[name] - p).abs().max().item() for name, p in reference.named_parameters())


@pytest.mark.parametrize("clip_type", ["full_model", "norm"])
def test_gradient_clipping_of_a_sharded_model_matches_the_unsharded_steps(clip_type):
    for error in run_on_ranks(_train_clipped, 2, args=(clip_type,), timeout_s=120):
        assert error < 1e-5


def _mixed_precision_dtypes():
    # param_dtype: the blocks compute in bfloat16 without autocast; the sharded parameters,
    # their gradients and the optimizer stay float32.
    seen = []
    torch.manual_seed(0)
    model = Blocks(dropout=0.0)
    model.layers[0][0].register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    sharded = shard_model(model, param_dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    SimpleTrainer(sharded, [_batch(n=4)] * 2, optimizer).train(0, 2)
    params = {p.dtype for p in sharded.parameters()} | {p.grad.dtype for p in sharded.parameters()}
    return seen, params


def test_mixed_precision_computes_in_the_param_dtype_and_keeps_float32_shards():
    for seen, dtypes in run_on_ranks(_mixed_precision_dtypes, 2, timeout_s=120):
        assert seen == [torch.bfloat16, torch.bfloat16]
        assert dtypes == {torch.float32}


def _evaluate_unevenly():
    # Rank r evaluates r + 1 batches: with the parameters gathered once, no forward pass
    # waits for another rank, and each output is the unsharded model's.
    from trainkit.modeling.sharding import gathered_parameters
    from trainkit.utils import comm

    rank = comm.get_rank()
    torch.manual_seed(0)
    reference = Blocks(dropout=0.0)
    sharded = shard_model(copy.deepcopy(reference))
    sharded.train()
    SimpleTrainer(sharded, [_batch(n=4)], torch.optim.SGD(sharded.parameters(), lr=0.0)).train(0, 1)
    errors = []
    with torch.no_grad(), gathered_parameters(sharded):
        for s in range(rank + 1):
            batch = _batch(seed=10 + s, n=4)
            errors.append((sharded(batch)["loss"] - reference(batch)["loss"]).abs().item())
    # Training goes on after the evaluation (parameters resharded, collectives in step).
    SimpleTrainer(sharded, [_batch(n=4)], torch.optim.SGD(sharded.parameters(), lr=0.0)).train(0, 1)
    return errors


def test_evaluation_with_gathered_parameters_lets_ranks_run_different_batch_counts():
    results = run_on_ranks(_evaluate_unevenly, 3, timeout_s=120)
    assert [len(errors) for errors in results] == [1, 2, 3]
    assert max(max(errors) for errors in results) < 1e-6


@pytest.mark.parametrize(
    ("group", "optimizer", "expected"),
    [
        # Linear(10, 3): weight (3, 10) and bias (3,), float32; split over 2: 2 rows each.
        (None, "sgd", {"parameters": 132, "gradients": 132, "optimizer": 132}),
        (2, "sgd", {"parameters": 88, "gradients": 88, "optimizer": 88}),
        # AdamW: two moments per element and a float32 step count per parameter.
        (2, "adamw", {"parameters": 88, "gradients": 88, "optimizer": 2 * 88 + 2 * 4}),
        (None, "plain-sgd", {"parameters": 132, "gradients": 132, "optimizer": 0}),
    ],
)
def test_state_bytes_count_padded_shards_and_the_optimizer_after_a_step(group, optimizer, expected):
    from trainkit.modeling.sharding import state_bytes_per_process

    build = {
        "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=0.1),
        "plain-sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
    }[optimizer]
    model = nn.Linear(10, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert state_bytes_per_process(model, build, shard_group_size=group) == expected
    for k, v in model.state_dict().items():  # the model itself is left alone
        assert torch.equal(v, before[k]) and v.device.type == "cpu"


def _bytes_held_after_a_step():
    # What a sharded process really holds after its first optimizer step: the distinct
    # storages of its parameter shards, their gradients and the SGD momentum, each once.
    from trainkit.modeling.sharding import state_bytes_per_process

    torch.manual_seed(0)
    model = Blocks(width=6, dropout=0.0)  # head weight (1, 6): one shard is all padding
    counted = state_bytes_per_process(
        model,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        shard_group_size=2,
    )
    sharded = shard_model(model)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1, momentum=0.9)
    SimpleTrainer(sharded, [_batch(n=4)], optimizer).train(0, 1)

    def held(tensors):
        storages = {t.to_local().untyped_storage() for t in tensors}
        return sum(s.nbytes() for s in {s.data_ptr(): s for s in storages}.values())

    params = list(sharded.parameters())
    measured = {
        "parameters": held(params),
        "gradients": held(p.grad for p in params),
        "optimizer": held(optimizer.state[p]["momentum_buffer"] for p in params),
    }
    return counted, measured


def test_state_bytes_are_the_largest_that_two_sharded_processes_hold():
    results = run_on_ranks(_bytes_held_after_a_step, 2, timeout_s=120)
    counted = results[0][0]
    for key in counted:  # exact: the padded shards as FSDP allocates them
        assert counted[key] == max(measured[key] for _, measured in results), results


def _amp_step_on_a_sharded_model(precision):
    # AMPTrainer on a sharded model: no autocast (FSDP casts the gathered parameters to the
    # param_dtype), float16 keeps its GradScaler; the shards and gradients stay float32.
    from trainkit.engine import AMPTrainer

    torch.manual_seed(0)
    model = Blocks(dropout=0.0)
    seen = []
    model.layers[0][0].register_forward_hook(
        lambda m, args, out: seen.append((out.dtype, torch.is_autocast_enabled("cpu")))
    )
    sharded = shard_model(model, param_dtype=precision)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    step = AMPTrainer(sharded, [_batch(n=4)] * 3, optimizer, precision=precision)
    step.train(0, 3)
    grads_finite = all(torch.isfinite(p.grad.full_tensor()).all() for p in sharded.parameters())
    return seen, step.grad_scaler is not None, grads_finite, {p.dtype for p in sharded.parameters()}


@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float16])
def test_amp_on_a_sharded_model_casts_through_fsdp_without_autocast(precision):
    for seen, has_scaler, finite, dtypes in run_on_ranks(
        _amp_step_on_a_sharded_model, 2, args=(precision,), timeout_s=120
    ):
        assert seen == [(precision, False)] * 3
        assert has_scaler is (precision == torch.float16) and finite
        assert dtypes == {torch.float32}


def _optimizer_built_before_sharding():
    from trainkit.modeling.sharding import check_optimizer_of_sharded_model
    from trainkit.utils.errors import UsageError

    model = Blocks()
    early = torch.optim.SGD(model.parameters(), lr=0.1)
    sharded = shard_model(model)
    check_optimizer_of_sharded_model(torch.optim.SGD(sharded.parameters(), lr=0.1), sharded)
    try:
        check_optimizer_of_sharded_model(early, sharded)
    except UsageError as e:
        return str(e)
    return None


def test_an_optimizer_built_before_sharding_is_refused_in_one_line():
    for message in run_on_ranks(_optimizer_built_before_sharding, 2, timeout_s=120):
        assert message is not None and "\n" not in message
        assert message.startswith("The optimizer holds 10 parameters that are not the sharded")
