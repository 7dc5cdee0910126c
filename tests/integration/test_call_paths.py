"""How many modules a reader walks: from the command line to the DataLoader, and per step.

``tools/train_net.py --config-file configs/shapes/cnn_small.yaml DATALOADER.NUM_WORKERS 2``
(grouping on) runs under ``sys.setprofile`` in a subprocess. Counted are the distinct
trainkit and ``tools/`` modules on the call stack:

* build: where the command line's value is parsed, merged into the config, set up and scaled,
  and at the train loader's ``DataLoader`` construction: the config value's way from the
  command line (docs/architecture.md lists it);
* per step: every call made while the training process draws a step's batches
  (``StepBatches.next``, from the third step on: the first ones start the iterator), from the
  step trainer's ``run_step`` down, and every call a loader worker makes while it fetches a
  batch (torch's fetcher: reading, mapping and collating the records), the two together.

The loader workers are forked, so they inherit the profile function.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MAX_BUILD_MODULES = 10
MAX_STEP_MODULES = 8

_DRIVER = textwrap.dedent(
    """
    import os, runpy, sys
    root, out = sys.argv[1], sys.argv[2]
    sys.argv = [os.path.join(root, "tools", "train_net.py"), *sys.argv[3:]]
    ours = (os.path.join(root, "trainkit") + os.sep, os.path.join(root, "tools") + os.sep)
    main_pid, state = os.getpid(), {"built": False, "draws": 0}
    _VALUE_STOPS = {"parse_args", "merge_from_list", "default_setup", "auto_scale_config"}
    seen = {}

    def module(filename):
        return os.path.relpath(filename, root) if filename.startswith(ours) else None

    def walk(frame):
        while frame is not None:
            yield frame
            frame = frame.f_back

    def record(kind, frame, stop=None):
        # The frames up to (and with) ``stop``'s: a step counts from the step trainer down.
        frames = []
        for f in walk(frame):
            frames.append(f)
            if f is stop:
                break
        found = {m for f in frames if (m := module(f.f_code.co_filename))}
        mine = seen.setdefault(kind, set())
        if found - mine:
            mine |= found
            with open(os.path.join(out, f"{kind}-{os.getpid()}.txt"), "w") as f:
                f.write("\\n".join(sorted(mine)))

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not state["built"] and code.co_name == "__init__" and code.co_filename.endswith(
            os.path.join("torch", "utils", "data", "dataloader.py")
        ):
            state["built"] = True
            record("build", frame)
            return
        if module(code.co_filename) is None:
            return
        if not state["built"] and code.co_name in _VALUE_STOPS:
            record("build", frame)  # where the value is parsed, merged, scaled
        if os.getpid() == main_pid:
            if code.co_name == "next" and code.co_filename.endswith("step_batches.py"):
                state["draws"] += 1
            draws = [f for f in walk(frame) if f.f_code.co_name == "next"
                     and f.f_code.co_filename.endswith("step_batches.py")]
            steps = [f for f in walk(frame) if f.f_code.co_name == "run_step"
                     and f.f_code.co_filename.endswith("simple_trainer.py")]
            if draws and steps and state["draws"] > 2:
                record("step", frame, stop=steps[0])
        else:
            fetches = [f for f in walk(frame) if f.f_code.co_name == "fetch"
                       and f.f_code.co_filename.endswith("fetch.py")]
            if fetches:
                record("worker", frame, stop=fetches[0])

    sys.setprofile(profile)
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.slow
def test_the_modules_a_config_value_and_a_record_pass(tmp_path):
    out = tmp_path / "paths"
    out.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    command = [
        sys.executable, str(driver), str(ROOT), str(out),
        "--config-file", str(ROOT / "configs" / "shapes" / "cnn_small.yaml"),
        "DATALOADER.NUM_WORKERS", "2", "DATALOADER.ASPECT_RATIO_GROUPING", "True",
        "SOLVER.MAX_ITER", "6", "TEST.EVAL_PERIOD", "0", "DATASETS.TEST", "()",
        "OUTPUT_DIR", str(tmp_path / "run"), "WRITERS", "('json',)",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    def modules(kind):
        found = set()
        for path in out.glob(f"{kind}-*.txt"):
            found |= set(path.read_text().split())
        return found

    build, step = modules("build"), modules("step") | modules("worker")
    assert modules("worker"), "no loader worker was seen fetching a batch"
    assert "tools/train_net.py" in build and "trainkit/data/loading/loader.py" in build
    assert len(build) <= MAX_BUILD_MODULES, sorted(build)
    assert len(step) <= MAX_STEP_MODULES, sorted(step)
