"""Long code says why it is long.

Functions past about 80 lines and modules past 500 lines are harder to read and change; where one
stays that long on purpose, a one-line ``# long: <why>`` comment says so: directly above the
``def`` (or its decorators) for a function, within the first 40 lines for a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("wattclass", "telemetry", "classifier", "plugin")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
MARK = "# long:"


def _sources() -> list[Path]:
    return sorted(p for folder in PACKAGE_FOLDERS for p in (REPO / folder).rglob("*.py"))


def _explained(lines: list[str], first_line: int) -> bool:
    """True if the line above ``first_line`` (the def or its first decorator) is ``# long: ...``."""
    i = first_line - 2
    return i >= 0 and lines[i].strip().lower().startswith(MARK)


def long_code_without_reason(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    if len(lines) > MAX_MODULE_LINES and not any(
        line.strip().lower().startswith(MARK) for line in lines[:40]
    ):
        out.append(f"{path.relative_to(REPO)}: module of {len(lines)} lines")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if n > MAX_FUNCTION_LINES and not _explained(lines, first):
                out.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name}() is {n} lines")
    return out


def test_long_functions_and_modules_say_why() -> None:
    missing = [m for p in _sources() for m in long_code_without_reason(p)]
    assert not missing, f"add a one-line '{MARK} <why>' comment (or split the code):\n" + "\n".join(missing)


def test_checker_sees_a_long_unexplained_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    bare = REPO / "tests" / "_shape_probe_tmp.py"
    try:
        bare.write_text(f"def f() -> None:\n{body}\n", encoding="utf-8")
        assert long_code_without_reason(bare) == [f"tests/{bare.name}:1: f() is 91 lines"]
        bare.write_text(f"# long: one table of constants\ndef f() -> None:\n{body}\n", encoding="utf-8")
        assert long_code_without_reason(bare) == []
    finally:
        bare.unlink(missing_ok=True)
