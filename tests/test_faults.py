"""Faults of a running fit: kill -9 at random moments and SIGTERM leave nothing that compare or a resume
accepts as a result, and a resumed fit ends where an uninterrupted one ends. A module of its own so
that pytest-xdist (--dist loadscope) can run it beside test_cli.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import bnn_zoo as bz
from bnn_zoo.cli import main


def _killable_fit(out) -> list[str]:
    """A real `bnn-zoo fit` of 1,500 SVI steps checkpointed every 50, writing to ``out``."""
    fit = [
        sys.executable,
        "-m",
        "bnn_zoo.cli",
        "fit",
        "--inference.steps",
        "1500",
        "--inference.checkpoint_every",
        "50",
    ]
    return fit + ["--evaluation.elbo_samples", "50", "--out", str(out), "--quiet"]


def test_a_fit_killed_at_random_moments_leaves_nothing_that_breaks_compare_or_a_resume(tmp_path, capsys):
    """kill -9 of a real `bnn-zoo fit` at seeded random moments (start-up, training, checkpointing,
    writing results): after each, `compare` either reads a finished run or refuses the folder in one
    line, `--resume` continues it, and the finished folder holds one consistent run."""
    import random

    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    fit = _killable_fit(out)
    rng = random.Random(0)
    for moment in sorted(rng.uniform(1.0, 9.0) for _ in range(3)):
        if (out / "metrics.json").exists():
            break
        run = subprocess.Popen([*fit, "--resume"], env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(moment)
        run.kill()
        _, err = run.communicate()
        assert "Traceback" not in err, err
        if out.exists():  # killed before it checked --out: nothing to read
            code = main(["compare", str(out), "--out", str(tmp_path / "cmp")])
            message = capsys.readouterr().err
            assert code == 0 or (code == 2 and message.count("\n") == 1), message
    finished = (
        subprocess.run([*fit, "--resume"], env=env, capture_output=True, text=True)
        if not (out / "metrics.json").exists()
        else None
    )
    assert finished is None or finished.returncode == 0, finished.stderr
    assert not list(out.glob(".*.tmp")) and not (out / "checkpoint.pt").exists()
    assert main(["compare", str(out), "--out", str(tmp_path / "cmp")]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["steps"] == 1500 and len(bz.load(out).sample_stats["loss"]) == 1500


def test_kill_saves_a_checkpoint_as_ctrl_c_does_and_the_fit_resumes_from_it(tmp_path):
    """SIGTERM unwinds a real `bnn-zoo fit` like Ctrl-C: the checkpoint holds the step it reached, the
    exit is 143 with one line, and --resume ends with every step."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    fit = _killable_fit(out)
    run = subprocess.Popen(fit, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "checkpoint.pt").exists():  # training has begun
        assert time.time() < deadline and run.poll() is None, "the fit did not reach its first checkpoint"
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=30)
    assert run.returncode == 143 and stderr.strip() == "bnn-zoo: terminated", stderr
    reached = int(re.search(r"interrupted: checkpoint at step (\d+) of \d+ saved", stdout).group(1))
    assert 50 <= reached < 1500
    resumed = subprocess.run([*fit, "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert len(bz.load(out).sample_stats["loss"]) == 1500
