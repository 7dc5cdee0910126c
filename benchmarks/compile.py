"""The ``compile`` task: the main job's step eager and compiled (CPU, inductor), graphs counted.

The main job's model and loader (``configs/shapes/cnn_small.yaml``): batches are taken from
the loader first, so the timed loops run the model and the optimizer only. Reported: steps/s
eager and compiled after warm-up (target >= 1.25x), the number of training graphs (<= 8,
each compiled once, none more once every planned shape was seen), the cold warm-up in eager
steps and per graph, and with a warm cache (a fresh process state: ``torch._dynamo.reset``)
the time to the first compiled step in eager steps (target <= 150).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from typing import Any

import torch

from benchmarks.measure import alternate, median
from benchmarks.report import print_table, target_text, verdict
from trainkit.config import get_cfg
from trainkit.data import build_train_loader
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.modeling import build_model, compile_stats
from trainkit.solver import build_optimizer

_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs/shapes/cnn_small.yaml"
)


def _cfg(compiled: bool, cache_dir: str, backend: str = "inductor") -> Any:
    cfg = get_cfg()
    cfg.merge_from_file(_CONFIG)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.MODEL.COMPILE.ENABLED = compiled
    cfg.MODEL.COMPILE.CACHE_DIR = cache_dir
    cfg.MODEL.COMPILE.BACKEND = backend
    return cfg


def _batches(cfg: Any, count: int) -> list[Any]:
    """``count`` training batches, covering every planned shape first if the plan allows."""
    loader = build_train_loader(cfg, ClassificationDatasetMapper(cfg, is_train=True))
    return list(itertools.islice(iter(loader), count))


def _steps(model: Any, optimizer: Any, batches: list[Any]) -> list[float]:
    """Run one step per batch; return each step's end time (perf_counter)."""
    ends = []
    for batch in batches:
        loss = sum(model(batch).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ends.append(time.perf_counter())
    return ends


def bench_compile(args: argparse.Namespace) -> dict[str, Any]:
    """Eager vs compiled steps/s, graphs, cold and warm-cache warm-up."""
    quick = bool(args.quick)
    # One torch thread, as the data task's step times: with two on a shared 2-core machine,
    # OpenMP's spinning threads made eager steps 15x slower (3 s instead of 0.2 s) whenever
    # another job ran.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the task's own cache, cold at first
    try:
        with tempfile.TemporaryDirectory(prefix="trainkit_compile_cache_") as cache_dir:
            return _bench(quick, args, cache_dir)
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = env


def _bench(quick: bool, args: argparse.Namespace, cache_dir: str) -> dict[str, Any]:
    # --quick checks the task runs: Dynamo traces, AOTAutograd runs, no code is generated.
    backend = "aot_eager" if quick else "inductor"
    cfg_e, cfg_c = _cfg(False, cache_dir), _cfg(True, cache_dir, backend)
    train_plan = build_model(cfg_c).shape_plans[0]
    # Enough batches that every planned shape turns up (120 do on the main job).
    num_batches = 4 if quick else int(getattr(args, "compile_batches", None) or 120)
    batches = _batches(cfg_e, num_batches)
    timed = batches[: min(40, len(batches))]

    torch.manual_seed(0)
    eager = build_model(cfg_e)
    eager_opt = build_optimizer(cfg_e, eager)
    _steps(eager, eager_opt, timed[:2])

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(cfg_c)
    opt = build_optimizer(cfg_c, model)
    start = time.perf_counter()
    ends = _steps(model, opt, batches)  # cold: compiles each shape as it first appears
    cold_s = ends[-1] - start
    graphs_seen = compile_stats(model).graphs
    _steps(model, opt, batches)  # every shape seen: must add no graph
    stats = compile_stats(model)

    def per_step(m: Any, o: Any) -> Any:
        def run() -> float:
            begin = time.perf_counter()
            _steps(m, o, timed)
            return (time.perf_counter() - begin) / len(timed)

        return run

    # Alternated rounds: a busy phase of a shared machine is not charged to one side.
    samples = alternate(
        {"eager": per_step(eager, eager_opt), "compiled": per_step(model, opt)},
        rounds=1 if quick else 5,
    )
    eager_step, compiled_step = median(samples["eager"]), median(samples["compiled"])

    # Warm cache: Dynamo forgets its graphs, the inductor's cache on disk stays.
    torch._dynamo.reset()
    model = build_model(cfg_c)
    opt = build_optimizer(cfg_c, model)
    start = time.perf_counter()
    first = _steps(model, opt, batches[:1])[0] - start

    speedup = eager_step / compiled_step
    cold_per_graph = cold_s / max(graphs_seen, 1)
    warm_in_eager = first / eager_step
    results = {
        "eager_step_s": eager_step,
        "compiled_step_s": compiled_step,
        "speedup": speedup,
        "planned_training_graphs": train_plan.num_shapes,
        "graphs_after_first_pass": graphs_seen,
        "graphs_after_second_pass": stats.graphs,
        "recompiles": stats.recompiles,
        "graph_breaks": stats.graph_breaks,
        "cold_warmup_s": cold_s,
        "cold_warmup_eager_steps": cold_s / eager_step,
        "cold_warmup_s_per_graph": cold_per_graph,
        "warm_first_step_s": first,
        "warm_first_step_eager_steps": warm_in_eager,
        "backend": backend,
        "rounds": len(samples["eager"]),
    }
    higher, lower = {"higher_is_better": True}, {"higher_is_better": False}
    rows = [
        ["steps/s compiled / eager", speedup, target_text(1.25, **higher),
         verdict(speedup, 1.25, **higher)],
        ["training graphs (planned)", train_plan.num_shapes, target_text(8, **lower),
         verdict(train_plan.num_shapes, 8, **lower)],
        ["new graphs once every shape was seen", stats.graphs - graphs_seen,
         target_text(0, **lower), verdict(stats.graphs - graphs_seen, 0, **lower)],
        ["graph breaks", stats.graph_breaks, "", ""],
        ["cold warm-up, eager steps (per graph: s)",
         f"{cold_s / eager_step:.0f} ({cold_per_graph:.1f} s)", "", ""],
        ["warm cache: first compiled step, eager steps", warm_in_eager,
         target_text(150, **lower), verdict(warm_in_eager, 150, **lower)],
    ]  # fmt: skip
    print_table(
        f"torch.compile on the main job (CPU, {backend}, {len(batches)} batches of "
        f"{cfg_c.SOLVER.IMS_PER_BATCH}, 1 torch thread; eager {eager_step * 1e3:.0f} ms/step, "
        f"compiled {compiled_step * 1e3:.0f} ms/step{', --quick' if quick else ''})",
        ["measure", "value", "target", "PASS/MISS"],
        rows,
    )
    return results
