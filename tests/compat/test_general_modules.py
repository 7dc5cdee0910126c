"""detectron2's general modules that trainkit adds at their paths: checkpoint.detection_checkpoint
and data.benchmark (the utils ones are tested in tests/utils)."""

import logging

import pytest
import torch
from torch import nn

from trainkit.data.samplers import InferenceSampler


def test_detection_checkpointer_at_its_module_path_saves_and_loads(tmp_path):
    import trainkit.checkpoint
    from trainkit.checkpoint.detection_checkpoint import DetectionCheckpointer

    assert DetectionCheckpointer is trainkit.checkpoint.DetectionCheckpointer
    trained, fresh = nn.Linear(3, 2), nn.Linear(3, 2)
    DetectionCheckpointer(trained, save_dir=str(tmp_path)).save("model_final")
    DetectionCheckpointer(fresh).load(str(tmp_path / "model_final.pth"))
    assert torch.equal(fresh.weight, trained.weight) and torch.equal(fresh.bias, trained.bias)


def _records(n=12):
    return [{"value": k} for k in range(n)]


def _double(record):
    return {"value": record["value"] * 2}


def test_iter_benchmark_times_after_warmup_and_stops_at_the_time_limit():
    from trainkit.data.benchmark import iter_benchmark

    drawn = []

    def items():
        while True:
            drawn.append(1)
            yield len(drawn)

    mean, seconds = iter_benchmark(items(), num_iter=4, warmup=3)
    assert len(drawn) == 7 and len(seconds) == 4 and mean == pytest.approx(sum(seconds) / 4)
    _, seconds = iter_benchmark(iter(int, 1), num_iter=10**6, warmup=0, max_time_seconds=0)
    assert len(seconds) == 1
    with pytest.raises(ValueError, match="num_iter >= 1"):
        iter_benchmark([], num_iter=0)
    with pytest.raises(ValueError, match="ended after 2 warm-up and 1 timed items of the 5"):
        iter_benchmark([1, 2, 3], num_iter=3, warmup=2)
    with pytest.raises(ValueError, match="ended after 1 warm-up and 0 timed"):
        iter_benchmark([1], num_iter=3, warmup=2)


def test_data_loader_benchmark_times_each_stage(caplog):
    from trainkit.data.benchmark import DataLoaderBenchmark, LoaderTiming

    bench = DataLoaderBenchmark(_records(), mapper=_double, total_batch_size=4, num_workers=0)
    with caplog.at_level(logging.INFO, logger="trainkit.data.benchmark"):
        dataset = bench.benchmark_dataset(6, warmup=1)
        mapper = bench.benchmark_mapper(6, warmup=1)
        workers = bench.benchmark_workers(2, warmup=1)
        ipc = bench.benchmark_IPC(2, warmup=1)
    assert isinstance(dataset, LoaderTiming) and len(dataset.seconds) == 6
    assert len(mapper.seconds) == 6 and "mapper" in mapper.name
    # 0 workers, then 1 (each candidate once): n workers time num_iter * n batches
    assert [len(t.seconds) for t in workers] == [2, 2]
    assert "0 workers" in workers[0].name and "1 workers" in workers[1].name
    assert len(ipc.seconds) == 2 and "dropped" in ipc.name
    assert dataset.items_per_second == pytest.approx(1 / dataset.mean)
    assert min(dataset.seconds) <= dataset.percentile(50) <= max(dataset.seconds)
    logged = caplog.text
    assert "dataset alone" in logged and "it/s" in logged and "p99=" in logged


def test_a_finite_sampler_is_read_again_by_the_dataset_benchmark_not_by_a_loader():
    from trainkit.data.benchmark import DataLoaderBenchmark

    bench = DataLoaderBenchmark(
        _records(3), mapper=_double, sampler=InferenceSampler(3), total_batch_size=1
    )
    assert len(bench.benchmark_dataset(7, warmup=2).seconds) == 7  # past the 3 indices
    with pytest.raises(ValueError, match="infinite sampler"):
        bench.benchmark_IPC(5, warmup=1)


def test_the_distributed_benchmark_on_one_rank():
    from trainkit.data.benchmark import DataLoaderBenchmark

    bench = DataLoaderBenchmark(_records(), mapper=_double, total_batch_size=2, seed=3)
    (timing,) = bench.benchmark_distributed(3, warmup=1)
    assert timing.name.startswith("rank 0 ") and len(timing.seconds) == 3
