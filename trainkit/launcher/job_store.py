"""The job's key-value store: serving and reaching it, one namespace per round, failures.

Machine 0's launcher (or torch's elastic agent, or rank 0 under plain ``env://``) serves one
TCP store for the job. Each round (each start or restart of its processes) works in a
namespace that :func:`agree_on_round` opens, where every process watches for its first
failure (:func:`post_abort`).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import socket
import time
import uuid
from typing import Any

import torch.distributed as dist

from trainkit.utils.errors import UsageError

__all__ = [
    "ROUND_KEY",
    "RendezvousAddressError",
    "RendezvousTimeoutError",
    "agree_on_round",
    "connect_store",
    "post_abort",
    "read_abort",
    "serve_store",
]

logger = logging.getLogger(__name__)

ROUND_KEY = "trainkit/round"  # the current round's namespace, set by its rank 0
_ROUNDS_KEY = "trainkit/rounds"  # how many rounds of this job have started
_ABORT_KEY = "abort"  # within a round's namespace: the round's first failure
_POLL_S = 0.05


class RendezvousTimeoutError(UsageError, TimeoutError):
    """The job's store could not be reached in time (a wrong address, or its host is down)."""


class RendezvousAddressError(UsageError, ValueError):
    """The job's store cannot listen on the address given (in use, or not this machine's)."""


def serve_store(host: str, port: int, timeout_s: float) -> tuple[dist.TCPStore, int]:
    """Serve a store on ``host:port`` (port 0: one the OS picks); return it and its port.

    The socket is bound here, before the store takes it over: a port in use is reported at
    once naming the address, and a loopback host listens on loopback only.

    Raises:
        RendezvousAddressError: If the port is in use or the host cannot be listened on.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    # A requeued SLURM job gets the same port again: connections of its previous run may
    # still linger in TIME_WAIT. (A port with a listener is still refused.)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise RendezvousAddressError(
                f"tcp://{host}:{port} is already in use (another job or program holds the "
                f"port); choose another port."
            ) from None
        if e.errno != errno.EADDRNOTAVAIL:
            raise RendezvousAddressError(
                f"cannot listen on tcp://{host}:{port}: {e.strerror}"
            ) from None
        # The host names this machine only indirectly (a DNS alias, a NAT address): let the
        # store listen on every interface instead.
        return dist.TCPStore(host, port, None, True, timeout, wait_for_workers=False), port
    sock.listen(1024)
    port = sock.getsockname()[1]
    # The store takes ownership of the descriptor (and closes it when it is destroyed).
    fd = sock.detach()
    return dist.TCPStore(
        host, port, None, True, timeout, wait_for_workers=False, master_listen_fd=fd
    ), port


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """Connect to the store on ``host:port``, waiting up to ``timeout_s`` for it to come up.

    Raises:
        RendezvousTimeoutError: With the address, if it could not be reached in time.
    """
    try:
        return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError):
        raise RendezvousTimeoutError(
            f"could not reach the rendezvous at tcp://{host}:{port} within {timeout_s:.0f} s. "
            f"Check that machine 0 was started with the same address and that it is reachable "
            f"from this machine."
        ) from None


def agree_on_round(
    store: dist.Store, rank: int, world_size: int, restart_count: int, timeout_s: float
) -> tuple[str, int]:
    """Return a namespace of the store that is this round's alone, and the round's index.

    Why: an elastic agent's store outlives the round, torch 2.13's c10d rendezvous keeps one
    store for every round's processes (``TORCHELASTIC_USE_AGENT_STORE``), and the process
    group adds no per-round prefix: a restarted round reads the dead round's keys (Gloo's
    peer addresses) and can hang. Keying by ``TORCHELASTIC_RESTART_COUNT`` fixes one machine
    only: each agent counts its own restarts, and a membership change restarts the others
    without counting (pytorch/pytorch#135712, #108158).

    How: rank 0 publishes a new namespace; every other rank registers a nonce under the
    namespace it reads, and uses it once rank 0's ``ready`` record lists that nonce. A stale
    namespace (a dead round's) never lists a fresh nonce, so its reader waits for the new one.
    """
    nonce = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        index = store.add(_ROUNDS_KEY, 1) - 1
        prefix = f"trainkit/round{index}-{nonce[:12]}"
        store.set(ROUND_KEY, prefix)
        keys = [f"{prefix}/member{r}" for r in range(1, world_size)]
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
        members = [json.loads(store.get(k)) for k in keys]
        index = max([index, restart_count] + [m["restart_count"] for m in members])
        ready = {"index": index, "nonces": [m["nonce"] for m in members]}
        store.set(f"{prefix}/ready", json.dumps(ready))
        return prefix, index
    registered = None
    while time.monotonic() < deadline:
        prefix = store.get(ROUND_KEY).decode() if store.check([ROUND_KEY]) else None
        if prefix is not None and prefix != registered:
            member = {"nonce": nonce, "restart_count": restart_count}
            store.set(f"{prefix}/member{rank}", json.dumps(member))
            registered = prefix
        if prefix is not None and store.check([f"{prefix}/ready"]):
            ready = json.loads(store.get(f"{prefix}/ready"))
            if nonce in ready["nonces"]:
                return prefix, ready["index"]
        time.sleep(_POLL_S)
    raise RendezvousTimeoutError(
        f"rank {rank} waited {timeout_s:.0f} s for rank 0 of the job to open a new round."
    )


def post_abort(round_store: dist.Store, record: dict[str, Any]) -> None:
    """Record the round's first failure (a later one is the consequence and is not kept)."""
    with contextlib.suppress(Exception):  # the store's host may be gone already
        round_store.compare_set(_ABORT_KEY, "", json.dumps(record))


def read_abort(round_store: dist.Store) -> dict[str, Any] | None:
    """Return the round's first failure, or None."""
    if not round_store.check([_ABORT_KEY]):
        return None
    return json.loads(round_store.get(_ABORT_KEY))
