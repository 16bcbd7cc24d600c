"""The Prolog/Epilog shell wrappers as slurmd runs them: isolated, always exit 0, failures to syslog.

Issue 9 items 10 and 19. The wrappers are the rendered deploy/slurm/*.sh; syslog is the real
/usr/bin/logger writing to a Unix datagram socket this test listens on (logger -u).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from wattclass.gpu.filestate import FileStateBackend
from wattclass.plugin.install import render_hook

pytestmark = pytest.mark.skipif(shutil.which("logger") is None, reason="util-linux logger missing")


@pytest.fixture
def syslog(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    path = tmp_path / "log.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    yield path, sock
    sock.close()


def _messages(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(65536).decode(errors="replace"))
        except TimeoutError:
            return out


def _wrapper(tmp: Path, kind: str, python: str, args: list[str], sock: Path) -> Path:
    src = render_hook(kind, python, args)
    assert 'LOGGER="/usr/bin/logger"' in src
    path = tmp / f"{kind}.sh"
    path.write_text(src.replace('LOGGER="/usr/bin/logger"', f'LOGGER="/usr/bin/logger -u {sock}"'))
    path.chmod(0o755)
    return path


def _run(script: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # slurmd's environment: no PATH, SLURM_* variables, PWD somewhere it chose
    return subprocess.run([str(script)], cwd=cwd, env={"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "", **env},
                          capture_output=True, text=True, timeout=60)


def _args(tmp: Path) -> list[str]:
    FileStateBackend.create(tmp / "gpus.json", 2)
    return ["--backend", f"filestate:{tmp / 'gpus.json'}", "--jobs-dir", str(tmp / "jobs"), "--state-dir",
            str(tmp / "caps"), "--log", str(tmp / "plugin.log"), "--gpu-map", str(tmp / "map.json")]


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_code_planted_in_the_working_folder_never_runs(tmp_path: Path, kind: str,
                                                       syslog: tuple[Path, socket.socket]) -> None:
    cwd = tmp_path / "slurmd-cwd"
    planted = cwd / "wattclass"
    (planted / "plugin").mkdir(parents=True)
    marker = tmp_path / "PWNED"
    code = f"open({str(marker)!r}, 'w').write('ran as root')\n"
    (planted / "__init__.py").write_text(code)
    (planted / "plugin" / "__init__.py").write_text(code)
    (planted / "plugin" / "prolog.py").write_text(code)
    (tmp_path / "map.json").write_text('{"0": "00000000:19:00.0"}')
    (tmp_path / "map.json").chmod(0o644)
    script = _wrapper(tmp_path, kind, sys.executable, _args(tmp_path), syslog[0])
    proc = _run(script, cwd, PYTHONPATH=str(cwd), PYTHONSTARTUP=str(planted / "__init__.py"))
    assert proc.returncode == 0
    assert not marker.exists(), "planted code ran"
    assert (tmp_path / "plugin.log").exists()  # the real hook ran (and opened its log)
    if kind == "prolog":
        assert "job 77: no GPUs" in (tmp_path / "plugin.log").read_text()


def test_wrong_interpreter_is_logged_to_syslog_and_exits_0(tmp_path: Path,
                                                           syslog: tuple[Path, socket.socket]) -> None:
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # an interpreter without wattclass, as /usr/bin/python3 often is
    script = _wrapper(tmp_path, "prolog", str(bare / "bin" / "python"), _args(tmp_path), syslog[0])
    proc = _run(script, tmp_path)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    msgs = _messages(syslog[1])
    assert len(msgs) == 1, msgs
    assert "wattclass-prolog" in msgs[0] and "job 77: prolog exited 1" in msgs[0]
    assert "ModuleNotFoundError: No module named 'wattclass'" in msgs[0]


def test_wattclass_errors_go_to_syslog_too(tmp_path: Path, syslog: tuple[Path, socket.socket]) -> None:
    args = _args(tmp_path)
    args[1] = f"filestate:{tmp_path / 'missing.json'}"  # the backend cannot open: an ERROR, exit 0
    script = _wrapper(tmp_path, "epilog", sys.executable, args, syslog[0])
    assert _run(script, tmp_path).returncode == 0
    msgs = _messages(syslog[1])
    assert msgs and all("wattclass-epilog" in m for m in msgs)
    assert any("job 77: epilog failed" in m and "missing.json" in m for m in msgs), msgs
    assert os.path.exists(tmp_path / "plugin.log")
