"""Rewrite the configuration table in docs/configuration.md from netrl/config/sections.py (run after changing a
config field)."""

from __future__ import annotations

import re
from pathlib import Path

from netrl.config.sections import describe_fields

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
START, END = "<!-- config-table -->", "<!-- /config-table -->"


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{key}` | `{default}` | {help_text} |" for key, default, help_text in describe_fields()]
    return "\n".join(rows)


def main() -> None:
    text = PAGE.read_text()
    new = re.sub(f"{re.escape(START)}.*?{re.escape(END)}", f"{START}\n{table()}\n{END}", text, flags=re.S)
    if START not in text:
        raise SystemExit(f"{PAGE} lacks the {START} ... {END} markers")
    PAGE.write_text(new)


if __name__ == "__main__":
    main()
