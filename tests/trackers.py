"""Real experiment trackers for tests, all on 127.0.0.1: an MLflow server, W&B offline files.

* :func:`mlflow_server` starts ``mlflow server`` (SQLite backend, local artifacts) on a free
  port, waits a bounded time for it, and stops its whole process group.
* :class:`TcpProxy` stands between a client and a server; :meth:`TcpProxy.stop` makes the
  server vanish mid-run (open connections reset, new ones refused).
* :func:`tracker_env` keeps W&B's files in a test's directory and both trackers off the
  internet (no telemetry, an online W&B run goes to a closed local port);
  :func:`wandb_records` reads what an offline run wrote (its ``run-<id>.wandb`` file).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.dist import free_port


@contextlib.contextmanager
def mlflow_server(root: Path, start_timeout_s: float = 90.0) -> Iterator[str]:
    """Run an MLflow tracking server under ``root``; yield its URL.

    Raises:
        RuntimeError: If it does not answer ``/health`` within ``start_timeout_s``.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # No background job runner (fewer processes, faster start), no telemetry.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **_NO_TELEMETRY}
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed in finally
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    # Its own process group: the server starts workers, and all of them must go.
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server did not start: {(root / 'server.log').read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield url
    finally:
        _stop_group(server)
        log.close()


def _stop_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    # Workers may outlive the main process; SIGKILL whatever is left of the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


class TcpProxy:
    """Forward connections from a port on 127.0.0.1 to ``target_port`` until stopped."""

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                if self._stopped:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        """Refuse new connections and reset the open ones: the server is gone."""
        with self._lock:
            self._stopped = True
            self._listener.close()
            for sock in self._sockets:
                # shutdown() also wakes the pump blocked in recv() on it (close() would not).
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


# No usage reports from MLflow (client or server).
_NO_TELEMETRY = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


def tracker_env(root: Path) -> dict[str, str]:
    """Environment variables that keep W&B's files under ``root`` and the trackers offline.

    ``WANDB_DIR`` is not set: it would move a run's files out of its output directory, where
    :func:`wandb_records` reads them (the caller removes it).

    An online W&B run would go to a closed port on 127.0.0.1 (the caller removes
    ``WANDB_API_KEY``); MLflow sends no telemetry.
    """
    closed_port = free_port()
    return {
        "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port}",
        "WANDB_CONFIG_DIR": str(root / "wandb_config"),
        "WANDB_CACHE_DIR": str(root / "wandb_cache"),
        "WANDB_DATA_DIR": str(root / "wandb_data"),
        "NETRC": str(root / "no_netrc"),
        "WANDB_CONSOLE": "off",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_ERROR_REPORTING": "false",
        **_NO_TELEMETRY,
    }


def wandb_records(output_dir: Path, timeout_s: float = 30.0) -> list:
    """The records (``wandb_internal_pb2.Record``) of the finished offline runs in ``output_dir``.

    An offline run writes its records to ``wandb/offline-run-*/run-<id>.wandb``: a 7-byte
    header (``:W&B``, a magic number, a version), then LevelDB-log blocks of 32 KiB whose
    chunks (7-byte header: checksum, length, type) carry serialised records. W&B's service
    writes that file in the background, after ``run.finish()`` returns: this waits (at most
    ``timeout_s``) until every run's file ends with its ``exit`` record.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        paths = sorted(glob.glob(str(output_dir / "wandb" / "offline-run-*" / "run-*.wandb")))
        per_run = [_records(Path(path)) for path in paths]
        finished = [any(r.WhichOneof("record_type") == "exit" for r in rs) for rs in per_run]
        if paths and all(finished):
            return [record for records in per_run for record in records]
        if time.monotonic() > deadline:
            raise AssertionError(f"W&B runs in {output_dir} not finished after {timeout_s} s")
        time.sleep(0.05)


def _records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    records = []
    for raw in _log_chunks(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def _log_chunks(data: bytes) -> Iterator[bytes]:
    block, full, first, middle, last = 32768, 1, 2, 3, 4
    if len(data) < 7:  # not even the header yet
        return
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # still being written
            return
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == full:
            yield chunk
        elif kind == first:
            pending = chunk
        elif kind == middle:
            pending += chunk
        elif kind == last:
            yield pending + chunk
        else:  # zero padding at the end of the file
            return


def wandb_history(output_dir: Path) -> dict[int, dict[str, float]]:
    """``{step: {key: value}}`` of what the offline runs in ``output_dir`` logged."""
    history: dict[int, dict[str, float]] = {}
    for record in wandb_records(output_dir):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {
            (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
            for item in record.history.item
        }
        history.setdefault(int(row["_step"]), {}).update(
            {k: v for k, v in row.items() if not k.startswith("_")}
        )
    return history


def wandb_summary(output_dir: Path) -> dict:
    """``{key: value}`` of the summary updates the offline runs in ``output_dir`` recorded."""
    summary: dict = {}
    for record in wandb_records(output_dir):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def wandb_runs(output_dir: Path) -> list:
    """The ``run`` records (id, project, config) of the offline runs in ``output_dir``."""
    return [r.run for r in wandb_records(output_dir) if r.WhichOneof("record_type") == "run"]


def wandb_config(run_record) -> dict:
    """The config a ``run`` record holds, as ``{key: value}``."""
    return {
        item.key: json.loads(item.value_json)
        for item in run_record.config.update
        if item.key != "_wandb"
    }
