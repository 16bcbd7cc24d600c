"""Imports follow the flow: each layer imports only from layers below it (wattclass/__init__.py).

A small AST walk instead of import-linter: every ``import``/``from`` of a ``wattclass`` module in
the package sources, at any depth (lazy imports inside functions count too), must point to the
same layer or a lower one. Within the components the flow is telemetry -> classifier -> plugin.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Source folder -> dotted package, as pyproject's package-dir maps them.
ROOTS = {
    "wattclass": "wattclass",
    "telemetry": "wattclass.telemetry",
    "classifier": "wattclass.classifier",
    "plugin": "wattclass.plugin",
    "deploy": "wattclass.deploy",
}

#: Lower rank = lower layer. A module may import from its own rank or below, never above.
RANKS: tuple[tuple[str, int], ...] = (
    ("wattclass.gpu", 1),
    ("wattclass.slurm", 1),
    ("wattclass.telemetry", 2),
    ("wattclass.classifier", 3),
    ("wattclass.plugin", 4),
    ("wattclass.report", 5),
    ("wattclass.fleet", 5),
    ("wattclass.savings", 5),  # what-if, calibration: label store, policy, cap records
    ("wattclass.demo", 6),
    ("wattclass.cli", 6),  # demo drives the CLI as a user would; the CLI loads demo lazily
    ("wattclass.deploy", 0),
    ("wattclass", 0),  # the foundation: every other module of the top package
)


def rank(module: str) -> int:
    for prefix, r in RANKS:
        if module == prefix or module.startswith(prefix + "."):
            return r
    raise AssertionError(f"{module} is in no layer")


def package_modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, dotted in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([dotted, *parts])] = path
    return out


def imported_wattclass_modules(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "wattclass"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "wattclass":
                continue
            # `from wattclass.x import y` may import the submodule y: rank the deeper name.
            for alias in node.names:
                found.append((node.lineno, f"{target}.{alias.name}"))
    return found


def test_every_module_is_in_a_layer() -> None:
    modules = package_modules()
    assert "wattclass.gpu.nvml" in modules and "wattclass.plugin.prolog" in modules
    for module in modules:
        rank(module)


def test_imports_only_go_down() -> None:
    modules = package_modules()
    violations = []
    for module, path in modules.items():
        for line, target in imported_wattclass_modules(path, module):
            # "from wattclass.errors import ConfigError" ranks wattclass.errors.ConfigError as
            # the foundation, which is what it is.
            if rank(target) > rank(module):
                violations.append(f"{path.relative_to(REPO)}:{line}: {module} imports {target}")
    assert not violations, "imports against the flow:\n" + "\n".join(violations)


@pytest.mark.parametrize(
    ("module", "target", "ok"),
    [
        ("wattclass.plugin.prolog", "wattclass.gpu.base.GpuBackend", True),
        ("wattclass.telemetry.daemon", "wattclass.classifier.rules", False),
        ("wattclass.classifier.nightly", "wattclass.plugin.prolog", False),
        ("wattclass.labeltable", "wattclass.plugin.decide", False),
        ("wattclass.report.build", "wattclass.classifier.store", True),
    ],
)
def test_rank_order(module: str, target: str, ok: bool) -> None:
    """The checker itself: a few known directions, so a broken rank table cannot pass silently."""
    assert (rank(target) <= rank(module)) is ok
