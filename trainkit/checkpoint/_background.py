"""Writing checkpoints in the background: the host copy, and one ordered writer thread.

The training thread copies the state to host memory (:class:`HostStaging`) and hands the copy
to a :class:`BackgroundWriter`, whose thread writes, fsyncs, renames and tags in order.
"""

from __future__ import annotations

import atexit
import copy
import logging
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

__all__ = ["BackgroundWriter", "CheckpointWriteError", "HostStaging"]

logger = logging.getLogger(__name__)


class CheckpointWriteError(RuntimeError):
    """A checkpoint written in the background could not be written (the message names it).

    Raised in the training thread, once, by the next ``save``, ``wait`` or periodic step
    after the failure; the original error (e.g. ``OSError`` for a full disk) is its
    ``__cause__``.
    """


class HostStaging:
    """Copies of a state in host memory, reusing the previous copy's tensors as buffers.

    Fresh memory costs a page fault per 4 KiB on first touch, several times the copy itself
    (measured: 0.5 GB/s into fresh memory, 15 GB/s into reused memory), so one copy's
    buffers are kept and overwritten by the next copy of a state with the same tensors. GPU
    tensors are copied into pinned buffers, all at once, then the devices are synchronised;
    CPU tensors with one memcpy each. The caller makes sure nothing reads the previous copy
    any more (``Checkpointer`` waits for the previous write before copying).
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def copy(self, state: Any) -> Any:
        """Return a copy of ``state`` that no later training step can change.

        A ``state_dict()`` references live parameters and optimizer buffers, which the next
        optimizer step overwrites in place. Containers (dict and subclasses with their
        attributes such as a state dict's ``_metadata``, list, tuple, namedtuple) are
        rebuilt, every tensor is copied to CPU memory (contiguous), any other value is
        deep-copied. Tensors that are the same view of the same memory (tied weights) are
        copied once and stay shared. The copy holds only CPU tensors.
        """
        previous, self._buffers = self._buffers, []
        devices: set[torch.device] = set()
        copied = self._copy(state, {}, iter(previous), devices)
        for device in devices:
            torch.cuda.synchronize(device)  # the non-blocking copies are complete
        return copied

    def clear(self) -> None:
        """Drop the kept buffers (the memory of one copy)."""
        self._buffers = []

    def _copy(
        self,
        obj: Any,
        memo: dict[tuple[Any, ...], torch.Tensor],
        reusable: Iterator[torch.Tensor],
        devices: set[torch.device],
    ) -> Any:
        if isinstance(obj, torch.Tensor):
            key = _view_key(obj)
            if key not in memo:
                memo[key] = self._copy_tensor(obj.detach(), reusable, devices)
            return memo[key]
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the mapping's type (OrderedDict, defaultdict)
            if hasattr(obj, "__dict__"):
                vars(out).update(copy.deepcopy(vars(obj)))
            for key, value in obj.items():
                out[key] = self._copy(value, memo, reusable, devices)
            return out
        if type(obj) in (list, tuple):
            return type(obj)(self._copy(value, memo, reusable, devices) for value in obj)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*(self._copy(value, memo, reusable, devices) for value in obj))
        return copy.deepcopy(obj)

    def _copy_tensor(
        self, t: torch.Tensor, reusable: Iterator[torch.Tensor], devices: set[torch.device]
    ) -> torch.Tensor:
        if t.layout is not torch.strided or t.is_quantized or t.is_nested or t.is_meta:
            return t.to("cpu", copy=True)  # rare kinds: a plain copy, not reused
        on_gpu = t.device.type == "cuda"
        # Tensors come in the same order every save; a changed state just reallocates.
        buffer = next(reusable, None)
        wanted = (t.shape, t.dtype, on_gpu)
        if buffer is None or (buffer.shape, buffer.dtype, buffer.is_pinned()) != wanted:
            buffer = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=on_gpu)
        if t.device.type == "cpu" and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
            # A plain memcpy. torch's copy_ splits a large copy over its intra-op threads,
            # and on a busy host (loader workers, other jobs) waits for descheduled ones:
            # 400 MB took 0.04-0.1 s this way against 0.2-1.7 s with copy_ on 2 busy cores.
            np.copyto(_as_bytes(buffer), _as_bytes(t))
        else:
            buffer.copy_(t, non_blocking=on_gpu)
        if on_gpu:
            devices.add(t.device)
        self._buffers.append(buffer)
        return buffer


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """The memory of a contiguous CPU tensor as a flat numpy byte array (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Equal for two tensors that are the same view of the same memory (tied weights)."""
    if t.layout is not torch.strided or t.is_meta:
        return ("object", id(t))
    return (
        t.device,
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
    )


class BackgroundWriter:
    """Run jobs one at a time, in submission order, on one thread; keep their failures.

    One thread (the training thread) submits, waits and checks; the writer thread, started
    with the first job, only runs jobs. A failure is kept until that thread asks
    (:meth:`wait`, :meth:`raise_if_failed`). Pending jobs finish before the interpreter
    exits (a failure nobody was told about is logged then); a process ended by ``os._exit``
    or a signal must :meth:`wait` first.
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        # (what the job does, what to do if it fails, its future), oldest first.
        self._jobs: list[tuple[str, str, Future[None]]] = []

    @property
    def pending(self) -> bool:
        """Whether a submitted job has not finished yet."""
        return any(not future.done() for _, _, future in self._jobs)

    def submit(
        self, what: str, job: Callable[[], None], *, advice: str = "", after_success: bool = False
    ) -> None:
        """Queue ``job``; it runs after every job submitted before it.

        ``what`` names it in an error message (``"write of checkpoint /x/m.pth"``), which
        ``advice`` (what the user should do if it fails) ends. With ``after_success`` it runs
        only if the job submitted just before it succeeded (or none is pending), and is
        skipped silently otherwise.
        """
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainkit-ckpt-writer")
            # Reports a failure nobody waited for; the executor itself already makes the
            # interpreter finish queued jobs before it exits.
            atexit.register(_wait_at_exit, weakref.ref(self))
        previous = self._jobs[-1][2] if (after_success and self._jobs) else None

        def run() -> None:
            # One writer thread: the previous job is done when this one starts.
            if previous is None or previous.exception() is None:
                job()

        self._jobs.append((what, advice, self._executor.submit(run)))

    def raise_if_failed(self) -> None:
        """Forget finished jobs; raise the first failure among them (once).

        Raises:
            CheckpointWriteError: If a finished job raised; its error is the ``__cause__``.
        """
        while self._jobs and self._jobs[0][2].done():
            what, advice, future = self._jobs.pop(0)
            error = future.exception()
            if error is not None:
                raise CheckpointWriteError(
                    f"Background {what} failed: {type(error).__name__}: {error}. {advice}".strip()
                ) from error

    def wait(self) -> None:
        """Block until every submitted job has finished, then report as :meth:`raise_if_failed`.

        Raises:
            CheckpointWriteError: If a job failed.
        """
        for _, _, future in list(self._jobs):
            future.exception()  # blocks until done; the error is raised below
        self.raise_if_failed()

    def close(self) -> None:
        """:meth:`wait`, then stop the thread (a later :meth:`submit` starts a new one)."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def _wait_at_exit(ref: weakref.ref[BackgroundWriter]) -> None:
    writer = ref()
    if writer is None:
        return
    try:
        writer.wait()
    except CheckpointWriteError as e:
        # Too late to raise: the program is ending. Logged so it is not lost.
        logger.error("%s", e)
