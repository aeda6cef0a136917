"""Every number the docs show, rendered from benchmarks/results/*.json or from the library's own constants.

python benchmarks/render.py chees-toy backends          # print these tables
python benchmarks/render.py --page README.md docs/*.md docs/*/*.md          # re-render what the pages mark
python benchmarks/render.py --page README.md docs/*.md docs/*/*.md --check  # fail if a page and the data differ

A page marks a rendered table as ``<!-- result: NAME -->`` ... ``<!-- end result -->``, and a number in its
prose as ``<!-- n: SOURCE PATH FORMAT -->`` ... ``<!-- /n -->``:

- SOURCE is a result file's name (``demo``) or a library constant (``bnn_zoo.inference.health:RHAT_MAX``),
  a field's default (``bnn_zoo:NUTS.max_hours``) or a function's (``bnn_zoo.evidence:ais.num_steps``);
- PATH walks the record by key or index: ``rows.run=nuts.rmse`` takes the first row whose ``run`` is
  ``nuts``, ``rows.0.wall_s`` the first row's;
- FORMAT is a Python format string with no space before its first brace, ``{:.3g}`` for a float by
  default.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import statistics
import sys
from pathlib import Path

from results import RESULTS


def header(record: dict) -> str:
    m = record["machine"]
    line = f"{record['date']}, {m['cpu']} ({m['cores']} cores), torch {m['torch']}, commit {record['commit']}"
    line += f", on {record['settings']['device']}" if record["settings"].get("device", "cpu") != "cpu" else ""
    earlier = record["settings"].get("earlier rows")  # sweep_tables.py --add
    return line + (f"; the rows it did not re-run: {earlier['date']}, commit {earlier['commit']}" if earlier else "")


def samplers(record: dict) -> str:
    """Per sampler: ESS/s of f by seed, its median, and the median's ratio to native NumPyro's."""
    by = {}
    for row in record["rows"]:
        by.setdefault(row["sampler"], []).append(row)
    base = statistics.median(r["ess_per_s"] for r in next(iter(by.values())))
    lines = [
        "| sampler | warm-up + draws | wall s | leapfrog steps / draw | min bulk ESS of f | max R-hat of f | ESS/s by "
        "seed | median | vs NumPyro |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for sampler, rows in by.items():
        median = statistics.median(r["ess_per_s"] for r in rows)
        rates = ", ".join(f"{r['ess_per_s']:.1f}" for r in rows)
        lines.append(
            f"| {sampler} | {rows[0]['draws']} | {_span(rows, 'wall', '{:.0f}')} | {_span(rows, 'steps', '{:.0f}')} | "
            f"{_span(rows, 'ess', '{:.0f}')} | {_span(rows, 'rhat_f', '{:.3f}')} | {rates} | {median:.1f} | "
            f"{median / base:.2f}x |"
        )
    return "\n".join(lines)


def _span(rows: list[dict], key: str, fmt: str) -> str:
    """The range of ``key`` over seeds, "low-high" (one value when they agree)."""
    ends = sorted({fmt.format(min(r[key] for r in rows)), fmt.format(max(r[key] for r in rows))}, key=float)
    return "-".join(ends)


def backends(record: dict) -> str:
    lines = [
        "| architecture | weights | rows | torch eager ms | XLA ms | torch / XLA | XLA compile s | auto backend |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + [backend_row(r) for r in record["rows"]])


def backend_row(r: dict) -> str:
    if r["jax_ms"] is None:
        traced = "untraceable | - | - |"
    else:
        traced = f"{r['jax_ms']:.2f} | {r['speedup']:.2f}x | {r['jax_compile_s']:.1f} |"
    return f"| {r['architecture']} | {r['weights']:,} | {r['rows']:,} | {r['torch_ms']:.2f} | {traced} {r['auto']} |"


def real_tables(record: dict) -> str:
    """Every method at its defaults on real tables: calibration, test log-likelihood per point (a
    classifier's -NLL), distance to NUTS, what the fit said, and what the test rows say of its band."""
    lines = [
        "| table | method | 90% band covers | 50% | test LL | RMSE / accuracy | W2 / agreement with NUTS | R-hat of f "
        "| time (s) | the fit's warning | on the test rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    num = lambda r, k, f="{:.3g}": f.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
    for r in record["rows"]:
        regression = r["task"] == "regression"
        said = "; ".join(_said(w) for w in r["warnings"]) or r.get("error") or ""
        lines.append(
            f"| {r['table']} | {r['method']} | {num(r, 'coverage_90', '{:.2f}')} | {num(r, 'coverage_50', '{:.2f}')} | "
            f"{num(r, 'test_log_likelihood') if regression else num({'ll': -r['nll']}, 'll')} | "
            f"{num(r, 'rmse' if regression else 'accuracy')}"
            f" | {num(r, 'w2' if regression else 'agreement')} | {num(r, 'max_rhat_function', '{:.3f}')} | "
            f"{r['time_s']:.0f} | {said} | {_judged(r.get('test_band_warning') or '')} |"
        )
    return "\n".join(lines)


def _said(warning: str) -> str:
    """A fit's warning, short and without its advice: "unconverged: R-hat of f 1.85 > 1.05 ..." """
    first = re.sub(r"^this \S+ fit ", "", warning).split("; ")[0].split(", so ")[0]
    first = first.replace("has a band that cannot be trusted:", "band:").replace("has not converged:", "unconverged:")
    return re.sub(r" \([^)]*$", "", first)  # a parenthesis the cut left open


def _judged(sentence: str) -> str:
    """The test rows' judgment of a band, short: "under-confident: covers 98% of 111" """
    found = re.search(r"covers (\S+) of (\d+) \S+ targets \(([^;]+);", sentence)
    return f"{found[3]}: covers {found[1]} of {found[2]}" if found else ""


def demo(record: dict) -> str:
    """The demo's table with the columns and formats ``bnn-zoo demo`` prints (``demo.COLUMNS``)."""
    from bnn_zoo.experiments.demo import COLUMNS

    columns = [(name, key, fmt) for name, key, fmt in COLUMNS if key in record["rows"][0]]
    lines = ["| run | " + " | ".join(name for name, _, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for r in record["rows"]:
        cells = ["-" if r[key] is None else fmt.format(r[key]) for _, key, fmt in columns]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows(record: dict) -> str:
    """Any other result file: its rows as they are, numbers to three significant figures."""
    keys = list(dict.fromkeys(k for r in record["rows"] for k in r))  # rows may measure different things
    cell = lambda v: "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"| {' | '.join(cell(r.get(k)) for k in keys)} |" for r in record["rows"]]
    return "\n".join([f"| {' | '.join(keys)} |", "|" + "---|" * len(keys), *lines])


def rendered(name: str) -> str:
    """One result file as its header line and table."""
    if name in LIBRARY:
        from bnn_zoo.version import __version__

        return f"**{name}** (bnn-zoo {__version__}, from the code):\n\n{LIBRARY[name]()}"
    record = json.loads((RESULTS / f"{name}.json").read_text())
    first = record["rows"][0] if record["rows"] else {}
    render = backends if {"jax_ms", "weights"} <= first.keys() else samplers if "ess_per_s" in first else rows
    render = real_tables if "warnings" in first and "table" in first else render
    render = demo if "rmse_beyond" in first else render
    render = rows if "ess_per_kgrad" in first else render  # per gradient, which samplers' table has not
    return f"**{name}** ({header(record)}):\n\n{render(record)}"


def library_defaults() -> str:
    """What each method fills in for a field left unset, by the network's kind and the rows it is fitted
    on: ``method.resolved(model, n)`` itself, so the table cannot drift from the code."""
    import dataclasses

    import bnn_zoo as bz
    import bnn_zoo.inference  # noqa: F401  (registers the zoo's methods)
    from bnn_zoo.methods import registered
    from bnn_zoo.models.cnn import LeNet
    from bnn_zoo.models.rnn import TextRNN

    dense = bz.BNN(bz.models.MLP(3, hidden=[50]))
    contexts = {
        "dense, 500 rows": (dense, 500),
        "dense, 5,000 rows": (dense, 5000),
        "convolutional": (bz.BNN(LeNet(), likelihood=bz.likelihoods.Categorical()), 1000),
        "recurrent": (bz.BNN(TextRNN(50), likelihood=bz.likelihoods.Categorical()), 300),
    }
    lines = [f"| method | field | {' | '.join(contexts)} |", "|---|---|" + "---|" * len(contexts)]
    own = {n: c for n, c in registered("bnn").items() if c.__module__.startswith("bnn_zoo.")}  # not a user's
    for name, method in own.items():
        unset = method()
        filled = [unset.resolved(model, n) for model, n in contexts.values()]
        for field in dataclasses.fields(unset):
            values = [getattr(f, field.name) for f in filled]
            if any(v != getattr(unset, field.name) for v in values):
                shown = ["full batch" if v is None and field.name == "batch_size" else f"{v}" for v in values]
                lines.append(f"| {name} | `{field.name}` | {' | '.join(shown)} |")
    return "\n".join(lines)


def registry() -> str:
    """The choices of each kind on the command line, with their config classes (``config.REGISTRY``)."""
    from bnn_zoo.experiments.config import REGISTRY

    lines = ["| kind | `--KIND NAME` | config class |", "|---|---|---|"]
    for kind, choices in REGISTRY.items():
        lines += [f"| {kind} | `{name}` | `{cls.__name__}` |" for name, cls in choices.items()]
    return "\n".join(lines)


LIBRARY = {"library-defaults": library_defaults, "registry": registry}  # rendered from the library, not a file
MARKED = re.compile(r"<!-- result: (?P<name>[\w-]+) -->\n.*?<!-- end result -->", re.S)
INLINE = re.compile(r"<!-- n: (?P<source>\S+)(?: (?P<path>[^\s{]+))?(?: (?P<format>[^\s{]*\{.*?))? -->.*?<!-- /n -->")


def value(source: str, path: str | None):
    """What an inline mark points at: a step into a record by key or index, a row chosen by ``key=value``."""
    if ":" in source:
        module, attributes = source.split(":")
        found = importlib.import_module(module)
        for attribute in attributes.split("."):  # a field's or parameter's default: bnn_zoo:NUTS.max_hours
            found = default(found, attribute) if inspect.isfunction(found) else getattr(found, attribute)
    else:
        found = json.loads((RESULTS / f"{source}.json").read_text())
    for step in path.split(".") if path else []:
        if "=" in step:
            key, wanted = step.split("=", 1)
            found = next(r for r in found if str(r[key]) == wanted)
        else:
            found = found[int(step) if step.isdigit() else step]
    return found


def default(function, parameter: str):
    """A function's default for ``parameter``, through the wrappers that check arguments."""
    return inspect.signature(function).parameters[parameter].default


def inline(m: re.Match) -> str:
    found = value(m["source"], m["path"])
    shown = (m["format"] or ("{:.3g}" if isinstance(found, float) else "{}")).format(found)
    return m[0][: m[0].index("-->") + 3] + shown + "<!-- /n -->"


def page(text: str) -> str:
    """The page with every marked table and number rendered afresh from its result file or constant."""
    text = MARKED.sub(lambda m: f"<!-- result: {m['name']} -->\n{rendered(m['name'])}\n<!-- end result -->", text)
    return INLINE.sub(inline, text)


def main() -> int:
    parser = argparse.ArgumentParser(description="Markdown tables from benchmarks/results/*.json")
    parser.add_argument("names", nargs="*", help="result files to print (default: all)")
    parser.add_argument(
        "--page", type=Path, nargs="+", help="markdown pages whose marked tables are re-rendered in place"
    )
    parser.add_argument(
        "--check", action="store_true", help="with --page: change nothing, fail if the page is out of date"
    )
    args = parser.parse_args()
    if args.page is None:
        for name in args.names or sorted(p.stem for p in Path(RESULTS).glob("*.json")):
            print(rendered(name) + "\n")
        return 0
    stale = []
    for path in args.page:
        text = path.read_text()
        fresh = page(text)
        if fresh != text and not args.check:
            path.write_text(fresh)
        stale += [str(path)] if fresh != text else []
    if args.check and stale:
        print(
            f"{', '.join(stale)} differ from benchmarks/results: run python benchmarks/render.py --page "
            f"{' '.join(stale)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
