"""The progress watchdog hook: phases and the local stall check (one process, fake clock)."""

import threading
import time
import types

from trainkit.engine.events import StepEvents
from trainkit.engine.hooks.watchdog import ProgressWatchdog


def test_phases_and_local_stall_with_fake_clock():
    now = [100.0]
    stalls = []
    wd = ProgressWatchdog(5.0, rank=0, clock=lambda: now[0], on_local_stall=stalls.append)
    events = StepEvents(types.SimpleNamespace(iter=3))
    events.subscribe(wd)  # the watchdog hears the loop's phases, it marks none itself
    events.phase("hooks")
    events.phase("data")
    now[0] += 2
    assert wd.record()["phase"] == "data" and wd.record()["elapsed_s"] == 2
    with events.during("eval"):
        assert wd.record()["phase"] == "eval"
    assert wd.record()["phase"] == "data"  # back to the phase before
    events.phase("checkpoint")
    now[0] += 6
    wd.start()
    deadline = time.monotonic() + 10
    while not stalls and time.monotonic() < deadline:
        time.sleep(0.05)
    wd.stop()
    assert stalls and "'checkpoint' at iteration 3" in stalls[0]


def test_disabled_watchdog_starts_nothing():
    before = {t.name for t in threading.enumerate()}
    wd = ProgressWatchdog(0, rank=0)
    wd.start()
    assert {t.name for t in threading.enumerate()} - before == set()
    wd.stop()
