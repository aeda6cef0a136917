"""Every number the docs show a user is rendered from a results file or a library constant
(``benchmarks/render.py``), or sits in an example's shown output; and every rendered one is up to date."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A measurement: a decimal, a number with a unit or a ratio, or a count of 100 and more (not a year).
NUMBER = re.compile(
    r"(?<![\w.#/^-])(?P<n>[-−]?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)"
    r"(?P<unit>\s?(?:x\b|×|%|s\b|ms\b|µs\b|min\b|minutes?\b|hours?\b|h\b|GiB\b|MiB\b|MB\b|nats?\b|seconds?\b))?"
)
# What is not a measurement: a version, an equation or section of a source, a PR or issue number.
NAMED = re.compile(
    r"\b(?:Python|python|torch|ArviZ|NumPy|pandas|jax|JAX|NumPyro|BlackJAX|torchax|CUDA|Pyro|GPyTorch|scipy|Ray|"
    r"jsonargparse|mkdocs|xarray|py|cp|equations?|[eE]qs?\.|section|Section|§|chapter|Chapter|figure|Figure|"
    r"table|Table|Tables|alg\.|sec\.|PR|issue)\s?[\d.x]+(?:\s*(?:to|-|and|,)\s*[\d.x]+)*"
)


def prose(text: str) -> str:
    """A page without what is not prose: code and its shown output, rendered marks, comments, link targets."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    text = re.sub(r"<!-- result: .*?<!-- end result -->", "", text, flags=re.S)
    text = re.sub(r"<!-- n: .*?<!-- /n -->", "", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)  # a code span may wrap to the next line
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return NAMED.sub("", text)


def unrendered(text: str) -> list[str]:
    found = []
    for line in prose(text).splitlines():
        for number in NUMBER.finditer(line):
            digits = number["n"].replace(",", "").lstrip("-−")
            count = digits.isdigit() and int(digits) >= 100 and not 1900 <= int(digits) <= 2099
            if number["unit"] or not digits.isdigit() or count:
                found.append(f"{number[0]!r} in: {line.strip()[:120]}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_number_on_the_page_is_rendered(page):
    found = unrendered(page.read_text())
    assert not found, "render these (benchmarks/render.py) or drop them:\n" + "\n".join(found)


def test_the_rendered_numbers_match_their_results(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # render.py imports its neighbour results.py
    spec = importlib.util.spec_from_file_location("render", ROOT / "benchmarks" / "render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    stale = [str(p.relative_to(ROOT)) for p in PAGES if render.page(p.read_text()) != p.read_text()]
    assert not stale, f"run python benchmarks/render.py --page {' '.join(stale)}"


def test_the_check_finds_what_it_should():
    page = (
        "NUTS took 6.2 s (<!-- n: demo rows.run=nuts.runtime_s {:.1f} -->6.2<!-- /n --> s), 3x, 1,500 rows, "
        "90% bands and 0.98; not Python 3.12, torch 2.2 to 2.x, eq. 3.18, 4 chains, 2026 or `0.5`.\n"
        "```text\n1.234\n```\n"
    )
    assert [f.split(" in:")[0] for f in unrendered(page)] == ["'6.2 s'", "'3x'", "'1,500'", "'90%'", "'0.98'"]
