"""The shipped systemd units call wattclass with options its parser really has."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wattclass.cli import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _exec_lines(unit: Path) -> list[str]:
    """ExecStart*/ExecStartPost lines, continuation lines joined."""
    text = unit.read_text().replace("\\\n", " ")
    return [m.group(1) for m in re.finditer(r"^ExecStart(?:Post)?=-?(.*)$", text, re.M)]


def _environment(unit: Path) -> dict[str, str]:
    """The unit's Environment= variables, split as systemd splits them.

    systemd reads ``Environment=`` as whitespace-separated assignments (quotes group words), so
    ``Environment=ARGS=--metrics-port 9410`` sets ARGS to ``--metrics-port`` alone and drops
    ``9410`` with a warning: the daemon then fails on a flag without its value."""
    env: dict[str, str] = {}
    for value in re.findall(r"^Environment=(.*)$", unit.read_text(), re.M):
        for word in shlex.split(value):
            name, eq, val = word.partition("=")
            assert eq and re.fullmatch(r"\w+", name), f"{unit.name}: {word!r} is not a systemd assignment"
            env[name] = val
    return env


def _wattclass_argv(line: str, env: dict[str, str]) -> list[str]:
    line = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), "X"), line)
    if "/bin/sh -c" in line:  # the command inside the shell string
        line = shlex.split(line)[2].split("exec ", 1)[1]
        line = re.sub(r"\$\([^)]*\)", "2026-11-30", line).replace("%%F", "")
    argv = shlex.split(line)
    assert argv[0].endswith("/wattclass"), line
    return [a for a in argv[1:] if a]


UNITS = ["wattclass-nightly.service", "wattclass-telemetry.service", "wattclass-reconcile.service"]


@pytest.mark.parametrize("unit", UNITS)
def test_unit_commands_parse(unit: str) -> None:
    path = DEPLOY / unit
    env = _environment(path)
    lines = _exec_lines(path)
    assert lines
    parser = build_parser()
    for line in lines:
        args = parser.parse_args(_wattclass_argv(line, env))  # SystemExit on an unknown option
        assert callable(args.func)


def _directives(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_units_read_site_settings_from_etc_default(unit: str) -> None:
    assert "-/etc/default/wattclass" in _directives(DEPLOY / unit).get("EnvironmentFile", [])


def test_nightly_unit_has_its_state_directory() -> None:
    d = _directives(DEPLOY / "wattclass-nightly.service")
    assert d["StateDirectory"] == ["wattclass"]
    assert "/var/lib/wattclass" in d["ReadWritePaths"][0].split()


def test_reconcile_unit_runs_once_before_slurmd() -> None:
    d = _directives(DEPLOY / "wattclass-reconcile.service")
    assert d["Type"] == ["oneshot"] and d["Before"] == ["slurmd.service"]
    assert "Requires" not in d and "RequiredBy" not in d  # a failed reconcile must not keep slurmd down
    unit = DEPLOY / "wattclass-reconcile.service"
    argv = _wattclass_argv(_exec_lines(unit)[0], _environment(unit))
    assert argv[:2] == ["plugin", "reconcile"]
    assert argv[2:] == ["--backend", "nvml", "--log", "/var/log/wattclass/plugin.log"]


def test_telemetry_unit_serves_metrics_on_the_documented_port() -> None:
    unit = DEPLOY / "wattclass-telemetry.service"
    args = build_parser().parse_args(_wattclass_argv(_exec_lines(unit)[0], _environment(unit)))
    assert args.metrics_port == 9410 and args.spool == Path("/run/wattclass/jobs")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    """``systemd-analyze verify`` reads the units as systemd will; it warns (exit 0) about an
    Environment= word that is not an assignment, so any line it prints about a unit fails."""
    wattclass = tmp_path / "wattclass"
    wattclass.write_text("#!/bin/sh\n")
    wattclass.chmod(0o755)
    units = []
    for src in [*UNITS, "wattclass-nightly.timer"]:
        dst = tmp_path / src
        dst.write_text((DEPLOY / src).read_text().replace("/usr/local/bin/wattclass", str(wattclass)))
        units.append(str(dst))
    run = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True,
                         timeout=60, check=False)
    problems = [ln for ln in (run.stdout + run.stderr).splitlines() if "wattclass" in ln]
    assert run.returncode == 0 and not problems, run.stdout + run.stderr


def _environment_file(text: str) -> dict[str, str]:
    """Assignments as systemd's EnvironmentFile= reads them: a comment is a whole line starting with
    '#' or ';'; after a value, '# ...' is part of the value; quotes around a value are removed."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, eq, value = line.partition("=")
        assert eq, f"{line!r} is not an assignment"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name.strip()] = value
    return env


def _etc_default_examples() -> list[str]:
    """The /etc/default/wattclass examples of docs/admin.md (code blocks that start with its name)."""
    text = (DEPLOY.parent / "docs" / "admin.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    return [b for b in blocks if b.startswith("# /etc/default/wattclass")]


@pytest.mark.parametrize("unit", UNITS)
def test_the_documented_etc_default_gives_commands_that_parse(unit: str) -> None:
    """A sysadmin copies admin.md's /etc/default/wattclass: every unit must still start."""
    examples = _etc_default_examples()
    assert examples, "docs/admin.md lost its /etc/default/wattclass example"
    path = DEPLOY / unit
    for example in examples:
        site = _environment_file(example)
        assert not [v for v in site.values() if "#" in v], f"a comment became part of a value: {site}"
        env = {**_environment(path), **site}
        for line in _exec_lines(path):
            args = build_parser().parse_args(_wattclass_argv(line, env))
            assert callable(args.func)


def test_admin_md_opens_the_metrics_in_etc_default_and_keeps_the_port() -> None:
    """admin.md said to add ``--metrics-bind 0.0.0.0`` "in the service's ExecStart", against the
    unit's own advice (site settings in /etc/default/wattclass; an upgrade replaces the unit). Done
    the documented way, WATTCLASS_TELEMETRY_ARGS replaces the unit's ``--metrics-port 9410``: a
    bind alone makes the daemon exit 2 ("--metrics-bind needs --metrics-port") in a restart
    loop. The example must serve on the opened address and the documented port."""
    unit = DEPLOY / "wattclass-telemetry.service"
    opened = []
    for example in _etc_default_examples():
        env = {**_environment(unit), **_environment_file(example)}
        args = build_parser().parse_args(_wattclass_argv(_exec_lines(unit)[0], env))
        if args.metrics_bind is not None:
            opened.append((args.metrics_bind, args.metrics_port))
    assert opened == [("0.0.0.0", 9410)]


def test_the_nightly_runs_in_a_folder_it_can_write() -> None:
    """DuckDB spills a query that outgrows its memory limit into ``.tmp`` under the working folder
    (the in-memory connections of classifier/scan.py and the report set no temp_directory). The
    unit set no WorkingDirectory=, so the nightly ran in "/", read-only under ProtectSystem=strict:
    a night too large for the admin node's memory failed ('Failed to create directory ".tmp"')
    instead of spilling. It runs in its state directory now, which it may write."""
    import duckdb

    with duckdb.connect() as con:  # as the nightly opens it
        ((temp,),) = con.sql("select current_setting('temp_directory')").fetchall()
    assert not Path(str(temp)).is_absolute()  # relative: under the working folder
    d = _directives(DEPLOY / "wattclass-nightly.service")
    (cwd,) = d["WorkingDirectory"]
    writable = [Path(p.lstrip("-")) for v in d["ReadWritePaths"] for p in v.split()]
    writable += [Path("/var/lib") / v for v in d.get("StateDirectory", [])]
    assert any(Path(cwd) == w or w in Path(cwd).parents for w in writable), (cwd, writable)


def test_the_docs_run_reconcile_again_with_restart() -> None:
    """The reconcile unit stays active after its run (RemainAfterExit=yes, so slurmd's ordering
    sees it done): after boot, ``systemctl start wattclass-reconcile`` does nothing at all. The
    alert rule for a leftover cap told the sysadmin to run it that way; a second run is a
    restart, and admin.md says so."""
    d = _directives(DEPLOY / "wattclass-reconcile.service")
    assert d["RemainAfterExit"] == ["yes"]
    rules = (DEPLOY / "prometheus-wattclass-rules.yml").read_text()
    admin = (DEPLOY.parent / "docs" / "admin.md").read_text()
    assert "systemctl restart wattclass-reconcile" in rules
    assert "systemctl start wattclass-reconcile" not in rules
    assert "systemctl restart wattclass-reconcile" in admin


def test_every_documented_prolog_and_epilog_line_names_the_installed_wrapper(tmp_path: Path) -> None:
    """slurm.conf lines a sysadmin copies must name the wrappers ``install-hooks --dest
    /etc/slurm/wattclass`` writes: a Prolog= path that does not exist drains every node a job
    starts on. admin.md's short form said ``/path/to/wattclass/prolog``."""
    dest = tmp_path / "wattclass"
    args = build_parser().parse_args(["plugin", "install-hooks", "--dest", str(dest),
                                      "--python", sys.executable])
    assert args.func(args) == 0
    written = {p.name for p in dest.iterdir()}
    docs = [DEPLOY.parent / "docs" / "admin.md", DEPLOY.parent / "docs" / "slurm.md",
            DEPLOY / "slurm" / "slurm.conf.snippet"]
    lines = [(doc.name, m.group(1), m.group(2)) for doc in docs
             for m in re.finditer(r"^(Prolog|Epilog)=(\S+)", doc.read_text(), re.M)]
    assert {kind for _, kind, _ in lines} == {"Prolog", "Epilog"}
    for doc, kind, path in lines:
        assert Path(path).parent == Path("/etc/slurm/wattclass") and Path(path).name in written, (doc, path)
        assert kind.lower() in Path(path).name, (doc, kind, path)


def test_the_slurm_conf_lines_warn_that_prologflags_is_one_setting() -> None:
    """slurmctld reads PrologFlags as one string, the last line winning ("specified more than once,
    latest value used", src/common/parse_config.c). The snippet said to add ``PrologFlags=Alloc``
    to slurm.conf: on a site with ``PrologFlags=Contain`` (pam_slurm_adopt) that line silently
    dropped Contain. Every place that shows the line says to merge it instead."""
    for doc in (DEPLOY / "slurm" / "slurm.conf.snippet", DEPLOY.parent / "docs" / "slurm.md",
                DEPLOY.parent / "docs" / "admin.md"):
        text = doc.read_text()
        assert re.search(r"^PrologFlags=Alloc", text, re.M), doc
        assert "add `Alloc` to" in text or "add Alloc to" in text, doc
        assert "Contain" in text, doc
    # the same for an existing Prolog=/Epilog= on Slurm 22.05 (one path or glob, the last line wins)
    for doc in (DEPLOY / "slurm" / "slurm.conf.snippet", DEPLOY.parent / "docs" / "slurm.md"):
        text = doc.read_text()
        assert "22.05" in text and "prolog.d/*" in text, doc
