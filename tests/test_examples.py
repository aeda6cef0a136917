"""The tutorial scripts the docs include run as written, and so does the calibration page's code on
their result folders (slow: a few minutes on 2 cores)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _script(name: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)], cwd=cwd, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_the_toy_tutorial_runs_and_prints_its_table(tmp_path):
    printed = _script("tutorial_guides_vs_nuts.py", tmp_path)
    rows = [line.split(" | ")[0].strip("| ") for line in printed.splitlines() if line.startswith("| ")][1:]
    assert rows == ["mean-field", "dropout p=0.1", "last-layer mean-field", "nuts", "gp rbf"]
    assert (tmp_path / "runs/tutorial-toy/bands.png").exists()


@pytest.mark.slow
def test_the_digits_tutorials_run_as_written(tmp_path, monkeypatch):
    printed = _script("tutorial_digits.py", tmp_path)
    assert {"mlp-mean-field", "cnn-mean-field", "cnn-dropout"} <= set(re.findall(r"\| ([\w-]+) \|", printed))
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "tutorials" / "calibration.md").read_text()
    for code in re.findall(r"```python\n(.*?)```", page, flags=re.S):
        exec(compile(code, "calibration.md", "exec"), {})
    assert (tmp_path / "runs/tutorial-digits/comparison/reliability.png").exists()
