"""Every ``bnn-zoo`` command the docs and the README show parses with the real parsers, as written: a
dry run that resolves ``fit``'s typed config (nothing is read or fitted) and the other commands'
options. Its metavariables (DIR, FILE, ...) stand for a value, as in ``--help``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from bnn_zoo import cli, methods
from bnn_zoo.experiments import config

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMANDS = ("demo", "fit", "compare", "sweep", "table", "reproduce", "reference", "list", "data")
EXAMPLE = {"DIR": "runs/x", "FILE": "examples/sweeps/toy-guides.yaml", "PATH": "data/x", "N": "2", "NAME": "nuts",
           "KIND": "nuts", "M": "lstm-untied", "P": "normal", "K": "sghmc"}  # fmt: skip


def shown(page: Path) -> list[str]:
    """Every bnn-zoo line of the page's bash blocks, and every bnn-zoo code span with options."""
    text = page.read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix(".venv/bin/")
            if line.startswith("bnn-zoo "):
                found.append(line)
    spans = re.findall(r"`(bnn-zoo [^`]+ --[^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return found + [s.replace("\n", " ") for s in spans if s.split()[1] in COMMANDS]  # a command, not a name


def argv(command: str) -> list[str]:
    """The arguments a shell passes, with each metavariable given a value and ``[--option N]`` taken."""
    words = shlex.split(re.sub(r"\[(--[^][]*)\]", r"\1", command), comments=True)[1:]
    return [EXAMPLE.get(w.rstrip("."), w) for w in words if w != "..."]


def dry_run(words: list[str]) -> None:
    """Parse as the command would; ``fit`` also resolves its typed config and records it where the run
    would (``OUT/config.yaml``), so a later ``--config`` on the page finds it."""
    if words[:1] != ["fit"]:
        cli.command_parser().parse_args(words)
        return
    given = [w for w in words[1:] if not w.startswith(("--print-config", "--print_config"))]
    if "--out" not in given and not any(w == "--help" or w.endswith(".help") for w in given):
        given += ["--out", "runs/x"]
    parser = cli.fit_parser()
    args = parser.parse_args(config.resolve_names(given))
    run = config.from_argv(parser, given)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "config.yaml").write_text(yaml.safe_dump(config.to_dict(run)))


@pytest.fixture
def registries(monkeypatch):
    """The method and config registries as they were before the test (a page's --inference FILE:Class adds
    the reader's method to both)."""
    monkeypatch.setattr(methods, "REGISTRY", dict(methods.REGISTRY))
    monkeypatch.setitem(config.REGISTRY, "inference", dict(config.REGISTRY["inference"]))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_on_the_page_parses(page, monkeypatch, tmp_path, registries):
    """The page's commands in order, in a fresh folder holding the network and the method docs/extending.md
    defines (``mynets.py``, ``mymethods.py``), as a reader who followed the docs has."""
    monkeypatch.chdir(tmp_path)
    extending = (ROOT / "docs" / "extending.md").read_text()
    (tmp_path / "mynets.py").write_text(re.findall(r"```python\n(.*?)\ntorch.manual_seed", extending, flags=re.S)[0])
    (tmp_path / "mymethods.py").write_text(re.findall(r"```python\n(# mymethods.py\n.*?)```", extending, flags=re.S)[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    failed = []
    for command in shown(page):
        assert not re.search(r"(?<!['\"\w])-[-\w.]+ \[", command), f"{command}: quote the list (zsh globs [50])"
        try:
            dry_run(argv(command))
        except SystemExit as stop:  # --help and KIND.help print and exit 0
            failed += [f"{command}: exit {stop.code}"] if stop.code else []
        except Exception as error:  # noqa: BLE001 - every failure of the page, in one report
            failed.append(f"{command}: {type(error).__name__}: {error}")
    assert not failed, "\n".join(failed)


def test_the_docs_show_commands():
    commands = [c for page in PAGES for c in shown(page)]
    assert len(commands) > 50 and sum(c.startswith("bnn-zoo fit ") for c in commands) > 20
