"""What the docs tell a sysadmin to type exists: commands, flags, files and metric names.

Docs drift from the code one renamed flag at a time (``--slurm-cluster`` outlived its rename to
``--dask-config`` in deploy/SCALEOUT.md). These checks read README.md, docs/*.md and deploy/*.md
as a reader would (code blocks and inline code) and hold each quoted ``wattclass ...`` command,
``bench/``/``tools/`` script flag, repository path and Prometheus metric against the code. Static
and fast: nothing listens; only ``promtool`` runs, where installed, on the scrape config.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from wattclass import policy
from wattclass.cli import build_parser
from wattclass.schema import TELEMETRY_V1
from wattclass.telemetry.metrics import LatestWindows

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "deploy").glob("*.md"))]
#: Words that end a quoted command: shell operators and comments.
_STOP = {"#", "|", "||", "&&", ";", ">", ">>", "2>&1"}
#: Paths in docs that are relative to a data root, not to the repository.
_DATA_ROOT_PATHS = {"classifier/cache"}


def _snippets(text: str) -> list[str]:
    """Code a reader would copy: each line of a fenced block (continuations joined), each inline span."""
    fence = r"```[^\n]*\n(.*?)```"
    lines = [ln for b in re.findall(fence, text, re.S) for ln in b.replace("\\\n", " ").splitlines()]
    spans = re.findall(r"`([^`]+)`", re.sub(fence, "", text, flags=re.S))
    return lines + [s.replace("\n", " ") for s in spans]


def _all_snippets() -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        for snippet in _snippets(doc.read_text()):
            yield doc.name, snippet


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _resolve(words: list[str]) -> tuple[list[str], list[argparse.ArgumentParser], list[str]]:
    """Walk subcommands (``prolog|epilog`` names alternatives): the path, its parsers, the rest."""
    parsers, path = [build_parser()], []
    while words:
        choices = _subparsers(parsers[0])
        names = words[0].replace("\\|", "|").split("|")
        if not choices or not all(n in choices for n in names):
            break
        parsers, path, words = [choices[n] for n in names], [*path, words[0]], words[1:]
    return path, parsers, words


def _flag_problems(parsers: list[argparse.ArgumentParser], words: list[str]) -> list[str]:
    """Flags the parsers lack, and values outside a flag's choices (placeholders in CAPS skipped)."""
    problems = []
    for parser in parsers:
        opts = _options(parser)
        for i, raw in enumerate(words):
            word = raw.strip("[](){}\"'")
            if not word.startswith("--"):
                continue
            flag, _, value = word.partition("=")
            action = opts.get(flag)
            if action is None:
                problems.append(f"{parser.prog}: no option {flag}")
                continue
            if not value and i + 1 < len(words):
                value = words[i + 1].strip("[](){}\"'")
            placeholder = not value or value.startswith("-") or not value.islower()
            if action.choices and not placeholder and value not in action.choices:
                problems.append(f"{parser.prog} {flag}: {value!r} is not one of {sorted(action.choices)}")
    return problems


def _quoted_commands() -> list[tuple[str, str, list[str], list[argparse.ArgumentParser], list[str]]]:
    """Every ``wattclass SUBCOMMAND ...`` quoted in the docs, up to a shell operator or comment."""
    found = []
    for doc, snippet in _all_snippets():
        for m in re.finditer(r"(?<![\w/.-])wattclass\s+(.*)", snippet):
            words: list[str] = []
            for w in m.group(1).split():
                if w in _STOP or w.startswith("#"):
                    break
                words.append(w)
            path, parsers, rest = _resolve(words)
            if path:
                found.append((doc, snippet, path, parsers, rest))
    return found


def test_every_quoted_wattclass_command_has_its_subcommand_and_flags() -> None:
    commands = _quoted_commands()
    assert len(commands) > 100, "the extraction found too few commands: is the regex still right?"
    problems = []
    for doc, snippet, path, parsers, rest in commands:
        where = f"{doc}: `{snippet.strip()[:100]}`"
        # a path that stops at a command group before a lowercase word names a subcommand that is gone
        if _subparsers(parsers[0]) and rest and re.fullmatch(r"[a-z][a-z-]+", rest[0]):
            problems.append(f"{where}: wattclass {' '.join(path)} has no {rest[0]!r}")
        else:
            problems += [f"{where}: {p}" for p in _flag_problems(parsers, rest)]
    assert not problems, "\n".join(problems)


def test_short_command_mentions_name_real_flags() -> None:
    """Inline mentions without the ``wattclass`` word (`nightly --table-group`, `install-lua --table`)."""
    by_name: dict[str, list[argparse.ArgumentParser]] = {}
    for name, parser in _subparsers(build_parser()).items():
        by_name.setdefault(name, []).append(parser)
        for sub, p in _subparsers(parser).items():
            by_name.setdefault(sub, []).append(p)
    problems, checked = [], 0
    for doc, snippet in _all_snippets():
        words = snippet.split()
        if len(words) < 2 or not words[1].startswith("--") or len(by_name.get(words[0], [])) != 1:
            continue
        checked += 1
        problems += [f"{doc}: `{snippet}`: {p}" for p in _flag_problems(by_name[words[0]], words[1:])]
    assert checked >= 3 and not problems, "\n".join(problems)


def test_quoted_bench_and_tools_flags_exist_in_their_scripts() -> None:
    problems, checked = [], 0
    for doc, snippet in _all_snippets():
        for m in re.finditer(r"((?:bench|tools)/[\w/]+\.py)((?:\s+[^\s`|;#]+)*)", snippet):
            script = REPO / m.group(1)
            if not script.is_file():
                problems.append(f"{doc}: {m.group(1)} does not exist")
                continue
            source = script.read_text()
            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", m.group(2)):
                checked += 1
                if f'"{flag}"' not in source and f"'{flag}'" not in source:
                    problems.append(f"{doc}: {m.group(1)} has no {flag}")
    assert checked > 20 and not problems, "\n".join(problems)


def test_repository_paths_in_the_docs_exist() -> None:
    top = "bench|tools|tests|deploy|classifier|telemetry|plugin|wattclass|docs"
    problems = []
    for doc, snippet in _all_snippets():
        for m in re.finditer(rf"(?<![\w/.$-])((?:{top})/[\w./=-]*\w)", snippet):
            path = m.group(1)
            glob = snippet[m.end():m.end() + 1] in ("*", "<", "{")
            if "=" in path or path in _DATA_ROOT_PATHS or glob:
                continue
            if not (REPO / path).exists():
                problems.append(f"{doc}: {path}")
    assert not problems, "paths that are not in the repository:\n" + "\n".join(problems)


def _exported_metrics() -> set[str]:
    """Every metric family the node daemon's endpoint serves, as Prometheus names it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LatestWindows())
    text = generate_latest(registry).decode()
    return set(re.findall(r"^# TYPE (\w+) ", text, re.M))


def test_every_dashboard_metric_is_exported() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana-wattclass.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = {n for e in exprs for n in re.findall(r"\bwattclass_\w+", e)}
    assert used and used <= _exported_metrics(), sorted(used - _exported_metrics())


def _documented_metrics() -> set[str]:
    """Metric names in admin.md's metrics table; ``_suffix`` and ``a/b_ratio`` expand the row's first name."""
    text = (REPO / "docs" / "admin.md").read_text()
    section = text.split("## Metrics for Prometheus and Grafana", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in re.findall(r"^\| (.*?) \| .* \|$", section, re.M):
        prefix = ""
        for token in re.findall(r"`([^`]+)`", row):
            token = token.split("{", 1)[0]
            if token.startswith("wattclass_"):
                prefix = "_".join(token.split("_")[:2])  # wattclass_gpu, wattclass_daemon, ...
                names.add(token)
            elif token.startswith("_") and prefix:
                stems = token[1:].split("/")
                suffix = stems[-1][len(stems[-1].split("_")[0]):]
                names |= {f"{prefix}_{s}" if s == stems[-1] else f"{prefix}_{s}{suffix}" for s in stems}
    return names


def test_admin_metrics_table_documents_exactly_what_is_exported() -> None:
    documented, exported = _documented_metrics(), _exported_metrics()
    assert documented == exported, (f"documented, not exported: {sorted(documented - exported)}; "
                                    f"exported, not documented: {sorted(exported - documented)}")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_metric_named_in_the_docs_is_exported(doc: Path) -> None:
    named = set(re.findall(r"\bwattclass_[a-z0-9_]+", doc.read_text()))
    assert named <= _exported_metrics(), sorted(named - _exported_metrics())


def test_design_md_telemetry_table_lists_the_schema() -> None:
    """docs/design.md's Telemetry v1 table names exactly the columns of wattclass/schema.py."""
    text = (REPO / "docs" / "design.md").read_text()
    table = text.split("## Telemetry v1", 1)[1].split("\nReaders tolerate", 1)[0]
    documented = {c.strip() for row in re.findall(r"^\| ([^|]+) \|", table, re.M) for c in row.split(",")}
    documented = {c for c in documented if re.fullmatch(r"[a-z0-9_]+", c)} - {"column"}
    assert documented == set(TELEMETRY_V1.names)


@pytest.mark.parametrize("doc", ["admin.md", "design.md"])
def test_policy_examples_in_the_docs_parse(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text()
    examples = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert examples
    for example in examples:
        parsed = policy.parse_policy(tomllib.loads(example), f"docs/{doc}")
        assert parsed.caps, example


def test_admin_policy_reference_covers_every_key() -> None:
    text = (REPO / "docs" / "admin.md").read_text()
    reference = text.split("## Policy reference", 1)[1].split("\n## ", 1)[0]
    keys = {re.split(r"[.< ]", k, maxsplit=1)[0] for k in re.findall(r"^\| `([^`]+)` \|", reference, re.M)}
    assert keys == policy._TOP_KEYS


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (apt prometheus)")
def test_the_documented_scrape_config_is_valid_and_names_the_dashboards_job(tmp_path: Path) -> None:
    text = (REPO / "docs" / "admin.md").read_text()
    configs = re.findall(r"```yaml\n((?:rule_files:|scrape_configs:).*?)```", text, re.S)
    assert configs
    # the rule file the config names, as admin.md says to copy it (promtool checks it too)
    shutil.copy(REPO / "deploy" / "prometheus-wattclass-rules.yml", tmp_path / "wattclass-rules.yml")
    dashboard = json.loads((REPO / "deploy" / "grafana-wattclass.json").read_text())
    job = next(v for v in dashboard["templating"]["list"] if v["name"] == "job")
    for i, config in enumerate(configs):
        path = tmp_path / f"prometheus{i}.yml"
        path.write_text(config)
        run = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True,
                             timeout=30, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"job_name: {job['query']}" in config


def test_design_md_layer_table_names_every_package() -> None:
    """Each package of pyproject (one level below wattclass) has its folder in the layers table."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    text = (REPO / "docs" / "design.md").read_text()
    table = text.split("## Layers and folders", 1)[1].split("\n\n", 2)[1]
    missing = []
    for package in project["packages"]:
        parts = package.split(".")
        if len(parts) != 2 or parts[1] == "deploy":  # deploy/ holds files, not code (said below the table)
            continue
        folder = project["package-dir"].get(package, "/".join(parts))
        if f"`{folder}/`" not in table:
            missing.append(folder)
    assert not missing, f"docs/design.md's layer table lacks {missing}"
