"""The signal side of pre-emption: the first signal is noted, a later second one exits."""

import os
import signal
import time

import trainkit.launcher.preemption as preemption
from trainkit.launcher import PreemptionSignal


def test_a_repeat_within_the_window_counts_once_a_later_one_exits_at_once(monkeypatch):
    now = [100.0]
    exits = []
    monkeypatch.setattr(preemption.os, "_exit", exits.append)
    monkeypatch.setattr(preemption.logging, "shutdown", lambda: None)
    listener = PreemptionSignal([signal.SIGTERM], clock=lambda: now[0])
    assert listener.received is None
    listener.note_signal("SIGTERM")
    now[0] += 1.0  # the launcher forwards the scheduler's signal: the same request
    listener.note_signal("SIGTERM")
    assert listener.received == "SIGTERM" and exits == []
    now[0] += 5.0
    listener.note_signal("SIGTERM")
    assert exits == [128 + signal.SIGTERM]


def test_install_notes_the_signal_and_uninstall_restores_the_previous_handler():
    before = signal.getsignal(signal.SIGUSR1)
    listener = PreemptionSignal([signal.SIGUSR1])
    listener.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while listener.received is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        listener.uninstall()
    assert listener.received == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before
