"""Run mypy --strict on the wattclass package as it is installed, from a source checkout.

pyproject's ``package-dir`` maps the top-level folders (telemetry/, classifier/, plugin/, deploy/)
into one ``wattclass`` namespace. mypy cannot follow that map, so run on the folders directly it
sees every cross-package import as ``Any`` and checks no override. This script lays out the
package the way it is installed, as a tree of symbolic links in build/typecheck/ derived from the
map itself, and runs mypy on ``-p wattclass`` there with the repository's configuration.
Usage: ``python3 tools/typecheck.py [extra mypy args]``; exit status is mypy's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_tree(out: Path) -> Path:
    """``out/wattclass/...`` with one link per mapped package folder; returns ``out``."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    if out.exists():
        shutil.rmtree(out)
    root = out / "wattclass"
    root.mkdir(parents=True)
    for entry in sorted((REPO / mapping["wattclass"]).iterdir()):
        if entry.name != "__pycache__":
            (root / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package == "wattclass":
            continue
        sub = package.split(".", 1)[1]
        link = root / sub
        if link.exists() or link.is_symlink():
            raise SystemExit(f"typecheck: {package} ({folder}/) collides with wattclass/{sub}")
        link.symlink_to(REPO / folder)
    return out


def main(argv: list[str]) -> int:
    tree = build_tree(REPO / "build" / "typecheck")
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
           "--cache-dir", str(REPO / ".mypy_cache"), "-p", "wattclass", *argv]
    return subprocess.run(cmd, cwd=tree, env={"MYPYPATH": str(tree), **_env()}, check=False).returncode


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "MYPYPATH"}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
