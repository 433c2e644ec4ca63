"""The user docs hold: every relative link names a file of the repository, every
``#anchor`` into a Markdown page names one of its headings, and the fused ops' table of
record is the one its results files print."""

import importlib.util
import pathlib
import re

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


def test_the_fused_ops_table_of_record_is_the_one_its_results_files_print():
    spec = importlib.util.spec_from_file_location("records_table", ROOT / "scripts/records_table.py")
    records_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(records_table)
    runs = records_table.load_runs()
    page = (ROOT / "docs/fused.md").read_text()
    assert records_table.table(runs) in page, "re-run `python scripts/records_table.py` and paste its table"
    assert records_table.goals(runs) in page, "re-run `python scripts/records_table.py` and paste its goals"
