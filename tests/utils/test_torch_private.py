"""The names of torch that torch does not promise to keep: each still there, and read only here.

Each check fails loudly when this torch lacks the name (the code relying on it would then
report nothing, or zeros); the CUDA-only ones are in tests/gpu/test_torch_private.py.
"""

import ast
from pathlib import Path

import torch
from torch import nn

import trainkit
from trainkit.utils import torch_private

PACKAGE = Path(trainkit.__file__).parent


def test_the_grad_scalers_inf_record_is_read_per_device_without_a_wait():
    layer = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    assert scaler.is_enabled()
    scaler.scale(layer(torch.ones(2, 3)).sum()).backward()
    scaler.unscale_(optimizer)
    found = torch_private.grad_scaler_found_inf(scaler, optimizer)
    assert found is not None and len(found) == 1 and found[0].item() == 0.0
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.scale(layer(torch.ones(2, 3)).sum() * float("inf")).backward()
    scaler.unscale_(optimizer)
    assert torch_private.grad_scaler_found_inf(scaler, optimizer)[0].item() == 1.0


def test_fused_optimizers_take_the_scalers_state_and_others_do_not():
    params = [nn.Parameter(torch.zeros(2))]
    assert torch_private.steps_with_scaler_state(torch.optim.AdamW(params, fused=True))
    assert not torch_private.steps_with_scaler_state(torch.optim.SGD(params, lr=0.1))


def test_a_backward_callback_comes_after_the_gradients_and_before_a_later_one():
    # DDP queues its wait for the all-reduce once the gradients are ready (as here).
    layer = nn.Linear(3, 1)
    engine = torch.autograd.Variable._execution_engine
    events = []
    layer.weight.register_post_accumulate_grad_hook(lambda p: events.append("grad"))
    layer.weight.register_post_accumulate_grad_hook(
        lambda p: engine.queue_callback(lambda: events.append("ddp waits"))
    )
    loss = layer(torch.ones(2, 3)).sum()
    torch_private.queue_backward_callback(loss, lambda: events.append("mark"))
    loss.backward()
    assert events == ["grad", "mark", "ddp waits"]
    torch_private.queue_backward_callback(torch.ones(()), lambda: events.append("no grad"))
    assert events == ["grad", "mark", "ddp waits"]  # a loss without a gradient: nothing


def test_dynamos_limit_cache_and_graph_breaks_are_read():
    assert torch_private.dynamo_recompile_limit() >= 1

    def double(x):
        return x * 2

    compiled = torch.compile(double, backend="eager")
    compiled(torch.ones(3))
    assert torch_private.dynamo_cache_entries(double) == 1
    compiled(torch.ones(3, 2))
    assert torch_private.dynamo_cache_entries(double) >= 2  # another shape: another graph
    assert isinstance(torch_private.dynamo_graph_breaks(), int)


def test_the_module_torch_compile_wraps_is_found():
    layer = nn.Linear(2, 2)
    assert torch_private.compiled_original(torch.compile(layer, backend="eager")) is layer
    assert torch_private.compiled_original(layer) is None


def test_the_cuda_memory_history_functions_exist():
    # Run on a GPU by tests/gpu/test_torch_private.py; here only their presence is checked.
    assert callable(torch.cuda.memory._record_memory_history)
    assert callable(torch.cuda.memory._dump_snapshot)


# Attribute names of torch objects that are private though not reached through "torch._".
_PRIVATE_ATTRIBUTES = {
    "_per_optimizer_states",
    "_step_supports_amp_scaling",
    "_execution_engine",
    "_orig_mod",
    "_record_memory_history",
    "_dump_snapshot",
    "_debug_get_cache_entry_list",
}


def _private_torch_reads(tree):
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch."):
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append((node.lineno, node.module))
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            from_torch = isinstance(value, ast.Name) and value.id == "torch"
            private = [a for a in chain if a.startswith("_") and not a.endswith("__")]
            if node.attr in _PRIVATE_ATTRIBUTES or (from_torch and private):
                found.append((node.lineno, ".".join(reversed(chain))))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if torch_private.CUDA_SYNC_WARNING in node.value:
                found.append((node.lineno, "torch's sync warning text"))
    return found


def test_no_other_module_reads_a_private_name_of_torch():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "torch_private.py":
            continue
        found = _private_torch_reads(ast.parse(path.read_text(), str(path)))
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert not offenders, f"read torch's private names outside utils/torch_private.py: {offenders}"
    # The check sees such a read (so it can fail).
    assert _private_torch_reads(ast.parse("import torch\ntorch.cuda.memory._dump_snapshot('x')"))
    assert _private_torch_reads(ast.parse("from torch._dynamo.utils import counters"))
