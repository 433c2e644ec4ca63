"""The user docs hold: every relative link names a file of the repository, every
``#anchor`` into a Markdown page names one of its headings, the tables of record are what
their results files print (``benchmarks/records.py``), the README's device API table is
the ops' signatures, and its first kernel runs as written."""

import inspect
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/results/README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def _anchor(heading: str) -> str:
    # GitHub's rule: lower case, punctuation other than '-' dropped, spaces to '-'.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(page: pathlib.Path) -> set[str]:
    text = CODE_BLOCK.sub("", page.read_text())
    return {_anchor(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


def _broken_links(page: pathlib.Path) -> list[str]:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _headings(linked):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_of_the_docs_resolves():
    broken = {page.relative_to(ROOT).as_posix(): _broken_links(page) for page in PAGES}
    assert not {page: links for page, links in broken.items() if links}


def test_the_performance_page_and_the_record_blocks_are_what_the_results_print():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import records
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = records.load()
    hint = "run `python benchmarks/records.py`"
    assert (ROOT / "docs/performance.md").read_text() == records.page(results), hint
    assert records.summary(results) in (ROOT / "README.md").read_text(), hint
    assert records.upstream_block(results) in (ROOT / "docs/upstream.md").read_text(), hint


def _signature(function) -> str:
    """``(a, b, c=None, d="x")`` as the README's table writes a device op's parameters."""
    import triton.language as tl

    parts = []
    for parameter in inspect.signature(function.fn).parameters.values():
        if parameter.default is inspect.Parameter.empty:
            parts.append(parameter.name)
            continue
        default = (
            parameter.default.value if isinstance(parameter.default, tl.constexpr) else parameter.default
        )
        shown = f'"{default}"' if isinstance(default, str) else repr(default)
        parts.append(f"{parameter.name}={shown}")
    return "(" + ", ".join(parts) + ")"


def test_the_readmes_device_api_table_is_the_ops_signatures():
    import iris

    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Device API") :].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`iris\..*?) \| `(\(.*?\))`(?:, `(\(.*?\))`)? \|$", table, re.M)
    assert len(rows) >= 10, "the table's rows were not found"
    checked = set()
    for names, first, second in rows:
        ops = [name.removeprefix("iris.") for name in re.findall(r"`([\w.]+)`", names)]
        signatures = [first, second] if second else [first] * len(ops)
        for op, written in zip(ops, signatures):
            assert _signature(getattr(iris, op)) == written, f"iris.{op}: the README says {written}"
            checked.add(op)
    device_ops = {"load", "store", "get", "put", "copy", "atomic_add", "atomic_cas", "signal", "wait_until"}
    assert device_ops <= checked


def test_the_readmes_first_kernel_runs_as_written(tmp_path):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## A first kernel\n\n```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "first.py"
    script.write_text(code)
    command = [sys.executable, "-m", "iris.run", "-n", "2", "-t", "200", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank} of 2: received 4096 values from rank {1 - rank}" in result.stdout
