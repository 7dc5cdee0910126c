"""trainkit.utils.memory.retry_if_cuda_oom: retried after emptying the cache, then on the CPU."""

import logging

import pytest
import torch

from trainkit.utils import memory
from trainkit.utils.memory import retry_if_cuda_oom


class _Flaky:
    """Runs out of memory the first ``failures`` calls, then returns its arguments."""

    def __init__(self, failures):
        self.failures = failures
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if len(self.calls) <= self.failures:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return args, kwargs


@pytest.fixture
def emptied(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    return calls


def test_no_error_no_retry(emptied):
    func = _Flaky(0)
    x = torch.ones(2)
    assert retry_if_cuda_oom(func)(x, k=1) == ((x,), {"k": 1})
    assert len(func.calls) == 1 and emptied == []


def test_one_oom_is_retried_after_emptying_the_cache(emptied):
    func = _Flaky(1)
    wrapped = retry_if_cuda_oom(func)
    assert wrapped(3) == ((3,), {})
    assert len(func.calls) == 2 and emptied == [1]
    assert wrapped.__wrapped__ is func


def test_a_second_oom_with_nothing_on_cuda_is_raised(emptied):
    func = _Flaky(5)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        retry_if_cuda_oom(func)(torch.ones(2), scale=2)
    assert len(func.calls) == 2


def test_a_second_oom_runs_on_the_cpu_with_a_warning(emptied, monkeypatch, caplog):
    # No CUDA here: a marker object plays the CUDA tensor that _to_cpu moves.
    on_gpu, on_cpu = object(), object()
    monkeypatch.setattr(memory, "_to_cpu", lambda v: on_cpu if v is on_gpu else v)
    func = _Flaky(2)
    with caplog.at_level(logging.WARNING, logger="trainkit.utils.memory"):
        assert retry_if_cuda_oom(func)(on_gpu, 1, mask=on_gpu) == ((on_cpu, 1), {"mask": on_cpu})
    assert len(func.calls) == 3
    assert "ran out of CUDA memory twice; running it on the CPU" in caplog.text


def test_other_errors_are_not_retried(emptied):
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("not memory")

    with pytest.raises(RuntimeError, match="not memory"):
        retry_if_cuda_oom(broken)()
    assert calls == [1] and emptied == []


def test_to_cpu_leaves_cpu_tensors_and_other_values_alone():
    x = torch.ones(1)
    assert memory._to_cpu(x) is x and memory._to_cpu("s") == "s"


@pytest.mark.gpu
def test_cuda_tensors_are_moved_for_the_last_try(emptied):
    x = torch.ones(2, device="cuda")
    func = _Flaky(2)
    (moved,), _ = retry_if_cuda_oom(func)(x)
    assert moved.device.type == "cpu" and torch.equal(moved, x.cpu())
