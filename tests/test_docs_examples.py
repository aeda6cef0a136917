"""The code on the docs' pages runs as written: "Your own network, prior and guide", and "Your own
data, end to end", whose shown output is what it prints."""

import contextlib
import io
import re
import textwrap
import warnings
from pathlib import Path

from bnn_zoo import arviz_compat

PAGE = Path(__file__).parent.parent / "docs" / "extending.md"


def test_the_extending_page_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = "\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S))
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    assert namespace["again"].settings["guide"].endswith("AutoLowRankMultivariateNormal")
    assert "diagonal-auto" in namespace["bz"].guides.GUIDES
    namespace["bz"].guides.GUIDES.pop("diagonal-auto")
    namespace["bz"].guides.DESCRIPTIONS.pop("diagonal-auto")


def test_the_api_reference_covers_every_public_name():
    """Every name in bnn_zoo.__all__ is the target of a `::: identifier` in docs/api (mkdocs build --strict,
    run by .ci/run, fails on an identifier that does not resolve)."""
    import importlib

    import bnn_zoo

    documented = []
    for page in (PAGE.parent / "api").glob("*.md"):
        for identifier in re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.M):
            module, _, attr = identifier.rpartition(".")
            try:
                documented.append(importlib.import_module(identifier))
            except ImportError:
                documented.append(getattr(importlib.import_module(module), attr))
    missing = [name for name in bnn_zoo.__all__ if not any(getattr(bnn_zoo, name) is obj for obj in documented)]
    assert not missing, f"public names without an API reference entry: {missing}"


def test_the_experiments_page_and_the_example_sweeps_build_their_runs():
    """The run config in YAML and in Python on docs/guide/experiments.md, the sweep file on
    docs/guide/sweeps.md, and every cell of the sweep files in examples/sweeps, parse and pass the config
    checks (nothing is fitted here)."""
    import yaml

    from bnn_zoo.experiments import config
    from bnn_zoo.experiments.sweep import Sweep

    page = (PAGE.parent / "guide" / "experiments.md").read_text()
    run = config.from_dict(yaml.safe_load(re.findall(r"```yaml\n(.*?)```", page, flags=re.S)[0]))
    assert isinstance(run.guide, config.Dropout) and run.guide.p == 0.05 and run.data.split == 3
    python = re.findall(r"```python\n(.*?)```", page, flags=re.S)[0]
    namespace: dict = {}
    exec(python.replace("result = execute(", "result = (lambda *a: a)("), namespace)  # build the run, do not fit it
    assert namespace["run"] == run
    sweeps = (PAGE.parent / "guide" / "sweeps.md").read_text()
    on_page = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", sweeps, flags=re.S)[0])
    assert on_page == yaml.safe_load((PAGE.parent.parent / "examples" / "sweeps" / "toy-guides.yaml").read_text())
    for path in sorted((PAGE.parent.parent / "examples" / "sweeps").glob("*.yaml")):
        sweep = Sweep.from_file(path)
        assert len({sweep.cell(o).key for o in sweep.outer()}) == len(sweep.outer()), path


def _numbers_close(shown: str, printed: str) -> bool:
    """The same text, and each number within 25% (plus 1 in its last place's units): the page's numbers
    are from one CPU, and another's floating-point path moves a short, unconverged chain."""
    number = r"-?\d+\.?\d*"
    if re.sub(number, "#", shown).split() != re.sub(number, "#", printed).split():
        return False
    pairs = zip(re.findall(number, shown), re.findall(number, printed), strict=True)
    return all(abs(float(a) - float(b)) <= 0.25 * max(abs(float(a)), abs(float(b))) + 1 for a, b in pairs)


def _steps(page: str, arviz: str) -> list[tuple[str, str]]:
    """The page's Python blocks with the output shown after each; of a block in content tabs
    (``=== "ArviZ 1.x"``), the tab for the installed ArviZ, with the output shown after the tabs."""
    blocks = re.findall(
        r'(?:=== "ArviZ ([^"]+)"\n\n)?( *)```python\n(.*?)\n\2```\n(?:\n```text\n(.*?)```)?', page, flags=re.S
    )
    steps, pending = [], None
    for tab, _indent, code, shown in blocks:
        if tab == arviz:
            pending = textwrap.dedent(code)
        elif not tab:
            steps.append((code, shown))
        if tab and shown:
            steps.append((pending, shown))
    return steps


def test_the_own_data_tutorial_prints_what_the_page_shows(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    page = (PAGE.parent / "guide" / "own-data.md").read_text()
    steps = _steps(page, "1.x" if arviz_compat.MAJOR >= 1 else "0.2x")
    namespace: dict = {}
    for code, shown in steps:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(code, "own-data.md", "exec"), namespace)
        assert _numbers_close(shown, printed.getvalue()), f"the page shows\n{shown}\nit prints\n{printed.getvalue()}"
    assert len(steps) == 5


def test_the_readmes_python_example_runs_as_written(tmp_path, monkeypatch):
    """The README's block as written, but for AIS at 50 temperatures (500 take 40 s): no fit collapses,
    and its comparison scores against a NUTS reference that passes the library's own rule."""
    monkeypatch.chdir(tmp_path)
    readme = (PAGE.parent.parent / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    assert "ais(nuts, num_steps=500)" in code
    code = code.replace("ais(nuts, num_steps=500)", "ais(nuts, num_steps=50)")
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*collapsed")
        exec(compile(code, "README.md", "exec"), namespace)
    table = namespace["table"]
    assert "reference_unconverged" not in table and table["w2"].notna().all(), table
    assert (table["units"] == "data's units").all()


def test_the_classification_page_prints_what_it_shows_and_writes_its_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = (PAGE.parent / "guide" / "own-classifier.md").read_text()
    namespace: dict = {}
    for code, shown in _steps(page, "no tabs"):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "own-classifier.md", "exec"), namespace)
        assert not shown or _numbers_close(shown, printed.getvalue()), printed.getvalue()
    assert (tmp_path / "cancer.csv").read_text().splitlines()[1].endswith(",malignant")


EXECUTED = {  # pages whose every Python block a test here runs, as written
    "README.md": test_the_readmes_python_example_runs_as_written,
    "docs/index.md": test_the_readmes_python_example_runs_as_written,  # the README's block, checked equal below
    "docs/extending.md": test_the_extending_page_runs,
    "docs/guide/own-data.md": test_the_own_data_tutorial_prints_what_the_page_shows,
    "docs/guide/experiments.md": test_the_experiments_page_and_the_example_sweeps_build_their_runs,
    "docs/guide/own-classifier.md": test_the_classification_page_prints_what_it_shows_and_writes_its_table,
}


def _markers(page: str) -> list[str]:
    """Per Python block, the fragment marker just above it ("" if none); one above content tabs
    (``=== "ArviZ 1.x"``) covers every tab's block."""
    found, marker, fence = [], "", None
    for line in page.splitlines():
        stripped = line.strip()
        if fence is not None:
            fence = None if stripped == "```" and line.startswith(fence) else fence
            continue
        if stripped.startswith("```"):
            fence = line[: len(line) - len(line.lstrip())]
            found += [marker] if stripped == "```python" else []
            continue
        if match := re.fullmatch(r"<!-- fragment: (\S+) -->", stripped):
            marker = match[1]
        elif stripped and not line.startswith((" ", "===")):
            marker = ""  # prose ends what a marker covers
    return found


def test_every_python_block_in_the_docs_runs_or_names_the_test_that_covers_it():
    """A block on a page a test above runs, or one marked ``<!-- fragment: tests/FILE.py::TEST -->``
    whose test exists (the tutorial scripts' tests are slow: pytest -m slow)."""
    root = PAGE.parent.parent
    readme, index = ((root / p).read_text() for p in ("README.md", "docs/index.md"))
    blocks = [re.findall(r"```python\n(.*?)```", page, flags=re.S) for page in (readme, index)]
    assert blocks[0] == blocks[1], "docs/index.md shows the README's Python block"
    unmarked = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        name = str(page.relative_to(root))
        for marker in _markers(page.read_text()):
            if name in EXECUTED:
                continue
            path, _, test = marker.partition("::")
            if not marker or f"def {test}(" not in (root / path).read_text():
                unmarked.append(f"{name}: {marker or 'a Python block with no fragment marker'}")
    assert not unmarked, "run these blocks in a test or mark them with the test that covers them:\n" + "\n".join(
        unmarked
    )
