"""The README stays short and the pages under docs/ stay true: links and anchors resolve, every page can be reached
from the README, the config table is the code's, and every netrl import in a Python example works."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes import imported_modules

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

FENCED = re.compile(r"^ *```.*?^ *```[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`]+`")  # a span may wrap onto the next line
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$", re.M)
PYTHON_BLOCK = re.compile(r"^ *```python\n(.*?)^ *```", re.M | re.S)
REPO_PATH = re.compile(r"(?<![\w./-])((?:netrl|scripts|tests|benchmarks)/[\w./-]*\w)")
LINK_TARGET = re.compile(r"\]\([^)\s]+")  # "](target": a link's target, not a repository path


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """``text`` without code: a link or heading inside a code block or a code span is not one."""
    return INLINE_CODE.sub("", FENCED.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for match in HEADING.finditer(FENCED.sub("", page.read_text())):
        base = anchor = slug(match.group(2))
        n = 0
        while anchor in found:  # GitHub numbers repeated headings: x, x-1, x-2
            n += 1
            anchor = f"{base}-{n}"
        found.add(anchor)
    return found


def relative_links(page: Path) -> list[str]:
    """Links to files in this repository (and to headings in this page), not to the web."""
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def link_problems(page: Path) -> list[str]:
    problems = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            problems.append(f"{rel(page)}: {target}: no file {file_part}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{rel(page)}: {target}: no heading #{fragment} in {rel(dest)}")
    return problems


def test_readme_is_at_most_200_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= 200, f"README.md has {lines} lines; move detail to a page under docs/"


def test_every_relative_link_and_anchor_resolves() -> None:
    assert [p for page in PAGES for p in link_problems(page)] == []


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in relative_links(page):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if dest.suffix == ".md" and dest.exists() and dest not in reached:
                reached.add(dest)
                todo.append(dest)
    assert sorted(rel(p) for p in set(PAGES) - reached) == []


def config_table_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_table", ROOT / "scripts" / "config_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_matches_the_code() -> None:
    script = config_table_script()
    text = script.PAGE.read_text()
    assert script.render(text) == text, "docs/configuration.md is stale: run python scripts/config_table.py"


def test_config_table_check_mode_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    script = config_table_script()
    stale = tmp_path / "docs" / "configuration.md"
    stale.parent.mkdir()
    stale.write_text(f"# Configuration\n\n{script.START}\n| key | default | meaning |\n{script.END}\n")
    monkeypatch.setattr(script, "PAGE", stale)
    assert script.main(["--check"]) == 1
    assert "run python scripts/config_table.py" in capsys.readouterr().err
    assert stale.read_text().count("|---|") == 0  # --check writes nothing
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0


def netrl_imports() -> list[tuple[str, str]]:
    """(where, statement) for each netrl import in the pages' Python examples, one statement each."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in PYTHON_BLOCK.finditer(text):
            first_line = text.count("\n", 0, block.start(1)) + 1
            try:
                tree = ast.parse(block.group(1))
            except SyntaxError as exc:
                found.append((f"{rel(page)}:{first_line + (exc.lineno or 1) - 1}", f"<does not parse: {exc.msg}>"))
                continue
            for node in ast.walk(tree):
                modules = imported_modules(node) or []
                if any(m == "netrl" or m.startswith("netrl.") for m in modules):
                    found.append((f"{rel(page)}:{first_line + node.lineno - 1}", ast.unparse(node)))
    return found


IMPORTS = netrl_imports()


def test_the_examples_import_netrl() -> None:
    assert len(IMPORTS) >= 4  # the README's, the tmrl port's and the pipeline example's: the scan finds them


@pytest.mark.parametrize(("where", "statement"), IMPORTS, ids=[f"{w} {s}" for w, s in IMPORTS])
def test_example_import_works(where: str, statement: str) -> None:
    # exec runs the statement as the reader's script would: a module, a name or a lazily loaded one
    exec(compile(statement, where, "exec"), {})


def test_every_repository_path_named_exists() -> None:
    # module paths in prose go stale when files move; a path that names no file here is one that did
    # (a link's target is relative to its page, and checked by the link test above)
    named = {(rel(page), path.rstrip(".")) for page in PAGES
             for path in REPO_PATH.findall(LINK_TARGET.sub("](", page.read_text()))}
    assert sorted(f"{page}: {path}" for page, path in named if not (ROOT / path).exists()) == []
