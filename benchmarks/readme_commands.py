"""The README's two commands, verbatim, in a fresh clone of this checkout's HEAD: wall time with the
install, exit status, and pytest's summary line, written to benchmarks/results/readme-commands.json.

python benchmarks/readme_commands.py

Run it alone on the machine: the README states these times for 2 cores.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

from results import write

ROOT = Path(__file__).parent.parent


def commands() -> dict[str, str]:
    """The README's two bash blocks under "Two commands": the demo's, then the tests'."""
    section = (ROOT / "README.md").read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    demo, tests = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)[:2]
    return {"demo": demo, "tests": tests}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "bnn-zoo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        for name, command in commands().items():
            start = time.perf_counter()
            done = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True)
            minutes = (time.perf_counter() - start) / 60
            lines = done.stdout.splitlines()
            summary = ([line for line in lines if " passed" in line] or [""])[-1].strip("= ")
            failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
            row = {"command": name, "minutes": minutes, "exit_status": done.returncode, "pytest": summary}
            rows.append(row | {"failed": failed})
            subprocess.run(["rm", "-rf", str(clone / ".venv")], check=True)  # each command starts fresh
            print(rows[-1], flush=True)
    write("readme-commands", rows, commands=commands())


if __name__ == "__main__":
    main()
