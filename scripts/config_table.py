"""Rewrite the configuration table in docs/configuration.md from netrl/config/sections.py, and
the table of renamed keys from netrl/config/renamed.py (run after changing a config field); with
--check, only say whether the page is up to date (exit 1 if not), as tests/test_docs.py does."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from netrl.config.renamed import RENAMED
from netrl.config.sections import describe_fields

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
START, END = "<!-- config-table -->", "<!-- /config-table -->"


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{key}` | `{default}` | {help_text} |" for key, default, help_text in describe_fields()]
    rows += ["", "Renamed keys: the old name still works, with a deprecation message that names",
             "the new key; a config that sets both is refused.", "", "| old key | new key |",
             "|---|---|"]
    rows += [f"| `{old}` | {' and '.join(f'`{k}`' for k in new)} |"
             for old, new in RENAMED.items()]
    return "\n".join(rows)


def render(text: str) -> str:
    """``text`` with the table between the markers replaced by the one the code gives."""
    if START not in text or END not in text:
        raise SystemExit(f"{PAGE} lacks the {START} ... {END} markers")
    # a function, not a replacement string: help texts may hold backslashes that re.sub would read as escapes
    return re.sub(f"{re.escape(START)}.*?{re.escape(END)}", lambda _: f"{START}\n{table()}\n{END}", text,
                  flags=re.S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the code, write nothing")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{PAGE.relative_to(PAGE.parent.parent)} is out of date with netrl/config/sections.py: "
                  "run python scripts/config_table.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
