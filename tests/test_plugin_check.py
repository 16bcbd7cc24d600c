"""``wattclass plugin check`` on a node installed into a temporary root (issue 9 item 19)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import venv
from pathlib import Path

import pytest

from wattclass.cli import main
from wattclass.gpu.filestate import FileStateBackend
from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import load_policy


@pytest.fixture(autouse=True)
def _a_squeue_on_the_hooks_path(tmp_path_factory: pytest.TempPathFactory,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrappers' PATH holds a squeue on every machine these tests run on (one that tells no
    version, as without a full slurm.conf), so `--slurm-conf` checks do not depend on the host's
    Slurm; tests of the squeue check itself give --slurm-bin."""
    from wattclass.plugin import slurmconf

    bin_dir = tmp_path_factory.mktemp("hookpath")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setattr(slurmconf, "HOOK_PATH", (str(bin_dir),))


def _install(root: Path, python: str = sys.executable) -> list[str]:
    root.chmod(0o755)
    etc = root / "etc"
    etc.mkdir(mode=0o755)
    FileStateBackend.create(root / "gpus.json", 2)
    args = f"--backend filestate:{root / 'gpus.json'} --state-dir {root / 'run' / 'caps'} " \
           f"--jobs-dir {root / 'run' / 'jobs'} --log {root / 'plugin.log'}"
    assert main(["plugin", "install-hooks", "--dest", str(etc), "--python", python, "--hook-args", args]) == 0
    (root / "run").mkdir(mode=0o755)
    policy = etc / "policy.toml"
    policy.write_text('mode = "enforce"\n[caps]\nmemory = "60%"\n')
    policy.chmod(0o644)
    write_label_table(etc / "labels.tsv", [TableEntry("user", "alice", None, None, "memory", 0.9, 3, "rule")],
                      load_policy(policy).table_dict())
    return ["plugin", "check", "--hooks-dir", str(etc), "--policy", str(policy),
            "--table", str(etc / "labels.tsv"), "--json"]


def _venv_importing_wattclass(where: Path) -> str:
    """A fresh venv (its bin/python a link to the base interpreter) that imports this wattclass, as
    the test interpreter does: through the editable install's .pth and finder, copied over."""
    venv.create(where, with_pip=False, system_site_packages=True)
    mine = next(Path(p) for p in sys.path
                if p.endswith("site-packages") and list(Path(p).glob("__editable__*")))
    site = next((where / "lib").glob("python3*/site-packages"))
    for f in mine.glob("__editable__*"):
        if f.is_file():
            shutil.copy(f, site / f.name)
    return str(where / "bin" / "python")


def _result(capsys: pytest.CaptureFixture[str]) -> dict[str, bool]:
    out = json.loads(capsys.readouterr().out)
    return {c["name"]: c["ok"] for c in out["checks"]}


def test_a_good_install_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _install(tmp_path)
    capsys.readouterr()
    rc = main(argv)
    got = _result(capsys)
    assert rc == 0 and all(got.values()), got
    assert set(got) == {"prolog wrapper", "epilog wrapper", "hook interpreter", "cap state folder",
                        "job map spool", "policy", "label table", "GPU backend"}
    main(argv[:-1])
    assert capsys.readouterr().out.count("[ OK ]") == 8


@pytest.mark.parametrize("damage", ["interpreter_without_wattclass", "state_owned_by_nobody", "bad_policy",
                                    "table_group_writable", "no_table", "wrapper_writable", "backend_gone",
                                    "interpreter_link_of_a_user", "interpreter_path_of_a_user"])
def test_each_failure_is_named_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           damage: str) -> None:
    """The last two: slurmd runs the hooks' interpreter as root on every job start, so one that a
    non-root user can replace (a link they own) or whose ``sys.path`` has a folder they own (a
    ``.pth`` line) is their code run as root; the check ran it and passed."""
    python = sys.executable
    if damage == "interpreter_without_wattclass":
        venv.create(tmp_path / "bare", with_pip=False)
        python = str(tmp_path / "bare" / "bin" / "python")
    elif damage.startswith("interpreter_") and damage.endswith("_of_a_user"):
        python = _venv_importing_wattclass(tmp_path / "v")
        if damage == "interpreter_link_of_a_user":  # bin/python: a link a user could re-point
            os.lchown(python, 65534, 65534)
        else:  # a folder of a user's on its sys.path (a .pth line)
            userlib = tmp_path / "userlib"
            userlib.mkdir()
            os.chown(userlib, 65534, 65534)
            site = next((tmp_path / "v" / "lib").glob("python3*/site-packages"))
            (site / "userlib.pth").write_text(f"{userlib}\n")
    root = tmp_path / "root"
    root.mkdir()
    argv = _install(root, python)
    capsys.readouterr()
    etc = root / "etc"
    want = {"interpreter_without_wattclass": "hook interpreter", "state_owned_by_nobody": "cap state folder",
            "interpreter_link_of_a_user": "hook interpreter",
            "interpreter_path_of_a_user": "hook interpreter",
            "bad_policy": "policy", "table_group_writable": "label table", "no_table": "label table",
            "wrapper_writable": "prolog wrapper", "backend_gone": "GPU backend"}[damage]
    if damage == "state_owned_by_nobody":
        (root / "run" / "caps").mkdir()
        os.chown(root / "run" / "caps", 65534, 65534)
    elif damage == "bad_policy":
        (etc / "policy.toml").write_text('[caps]\nmemory = 0.6\n')
    elif damage == "table_group_writable":
        (etc / "labels.tsv").chmod(0o664)
    elif damage == "no_table":
        (etc / "labels.tsv").unlink()
    elif damage == "wrapper_writable":
        (etc / "prolog.sh").chmod(0o777)
    elif damage == "backend_gone":
        (root / "gpus.json").unlink()
    assert main(argv) == 1
    got = _result(capsys)
    assert got[want] is False and sum(not ok for ok in got.values()) == 1, got


@pytest.mark.parametrize("state", ["current", "current_non_ascii_path", "older", "other_table", "missing"])
def test_the_controllers_job_submit_lua_is_checked_when_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str) -> None:
    """An older job_submit.lua refuses a table with lines it does not know (e.g. per-label
    thresholds): jobs are then left as submitted, silently outside slurmctld.log."""
    argv = _install(tmp_path)
    etc = tmp_path / "etc"
    lua = etc / "job_submit.lua"
    table = etc / "labels.tsv"
    if state == "current_non_ascii_path":  # install-lua writes it as an escaped Lua literal
        (etc / "läbels \"x\".tsv").write_bytes(table.read_bytes())
        table = etc / "läbels \"x\".tsv"
        table.chmod(0o644)
        i = argv.index("--table")
        argv[i + 1] = str(table)
    assert main(["plugin", "install-lua", "--table", str(table if state != "other_table" else etc / "x.tsv"),
                 "--dest", str(lua)]) == 0
    if state == "older":
        text = lua.read_text()
        assert 'kind == "min_confidence_label"' in text
        lua.write_text(text.replace('kind == "min_confidence_label"', 'kind == "min_confidence_label_old"'))
    elif state == "missing":
        lua.unlink()
    capsys.readouterr()
    rc = main([*argv, "--job-submit", str(lua)])
    out = json.loads(capsys.readouterr().out)
    got = {c["name"]: c for c in out["checks"]}
    ok = state.startswith("current")
    assert got["job_submit.lua"]["ok"] is ok, got["job_submit.lua"]
    assert rc == (0 if ok else 1)
    if state == "older":
        assert "install-lua" in got["job_submit.lua"]["detail"]
    if state == "other_table":
        assert "x.tsv" in got["job_submit.lua"]["detail"]


def test_a_missing_policy_is_named_as_the_policy_file(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The default /etc/wattclass/policy.toml on a machine without /etc/wattclass: the check read
    "[Errno 2] No such file or directory: '/etc/wattclass'", a folder, not the policy file."""
    argv = _install(tmp_path)
    missing = tmp_path / "etc" / "wattclass" / "policy.toml"
    argv[argv.index("--policy") + 1] = str(missing)
    capsys.readouterr()
    assert main(argv) == 1
    got = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert got["policy"]["detail"] == f"{missing}: policy file not found"


def test_install_lua_refuses_a_relative_table_path(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """slurmctld would read ``etc/slurm/wattclass/labels.tsv`` from its own working folder, and
    job_submit.lua's walk up the table's folders stops where the path does, so no folder from that
    working folder up to / was checked. install-lua wrote it (exit 0); now it names --table, exit 2."""
    dest = tmp_path / "job_submit.lua"
    rel = "etc/slurm/wattclass/labels.tsv"
    assert main(["plugin", "install-lua", "--table", rel, "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "--table 'etc/slurm/wattclass/labels.tsv'" in err and "absolute path" in err
    assert not dest.exists()


GOOD_SLURM_CONF = """# the cluster's own lines
ClusterName=c1
JobSubmitPlugins=lua
prolog=/etc/slurm/wattclass/prolog.sh   Epilog=/etc/slurm/wattclass/epilog.sh
PrologFlags=Alloc
ProctrackType=proctrack/cgroup
SelectType=select/cons_tres
Include nodes.conf
"""


def _slurm_conf(tmp_path: Path, extra: str = "", cgroup: str | None = "ConstrainDevices=yes\n") -> Path:
    (tmp_path / "nodes.conf").write_text("NodeName=gpu[01-02] Gres=gpu:4\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(GOOD_SLURM_CONF + extra)
    if cgroup is not None:
        (tmp_path / "cgroup.conf").write_text(cgroup)
    return conf


@pytest.mark.parametrize("extra", ["", "AccountingStorageType=accounting_storage/slurmdbd\n"
                                   "AccountingStorageTRES=gres/shard,gres/gpu:h200,gres/gpu\n"])
def test_slurm_conf_with_what_the_caps_need_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   extra: str) -> None:
    (tmp_path / "node").mkdir()
    argv = _install(tmp_path / "node")
    conf = _slurm_conf(tmp_path, extra)
    capsys.readouterr()
    assert main([*argv, "--slurm-conf", str(conf)]) == 0
    assert _result(capsys)["slurm.conf"] is True


@pytest.mark.parametrize(("extra", "cgroup", "named"), [
    ("JobSubmitPlugins=require_timelimit\n", "ConstrainDevices=yes\n", "JobSubmitPlugins"),  # the last wins
    ("Epilog=\n", "ConstrainDevices=yes\n", "Epilog is not set"),
    ("ProctrackType=proctrack/linuxproc\n", "ConstrainDevices=yes\n", "proctrack/linuxproc"),
    ("AllowSpecResourcesUsage=YES\n", "ConstrainDevices=yes\n", "AllowSpecResourcesUsage=yes"),
    ("SelectType=select/linear\n", "ConstrainDevices=yes\n", "SelectType=select/linear"),  # whole nodes
    ("", "ConstrainDevices=no\n", "ConstrainDevices is no"),
    ("", "# ConstrainDevices=yes\nConstrainCores=yes\n", "ConstrainDevices is no"),
    ("", None, "ConstrainDevices is no cgroup.conf"),
    # with slurmdbd, requested GPUs must be a TRES: job_submit.lua's modify reads a pending
    # --ntasks-per-gpu job's GPUs there (its job record has no GPU field)
    ("AccountingStorageType=accounting_storage/slurmdbd\n", "ConstrainDevices=yes\n",
     "AccountingStorageTRES lacks gres/gpu"),
    ("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageTRES=gres/shard\n",
     "ConstrainDevices=yes\n", "AccountingStorageTRES lacks gres/gpu"),
])
def test_slurm_conf_lacking_a_cap_precondition_fails_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, cgroup: str | None,
        named: str) -> None:
    (tmp_path / "node").mkdir()
    argv = _install(tmp_path / "node")
    conf = _slurm_conf(tmp_path, extra, cgroup)
    capsys.readouterr()
    assert main([*argv, "--slurm-conf", str(conf)]) == 1
    out = json.loads(capsys.readouterr().out)
    line = next(c for c in out["checks"] if c["name"] == "slurm.conf")
    assert not line["ok"] and named in line["detail"] and str(conf) in line["detail"], line


@pytest.mark.parametrize(("version", "ok"), [
    (None, False), ((22, 5), False), ((23, 2), False), ((23, 11), True), ((25, 11), True)])
def test_an_unset_select_type_passes_only_where_slurms_default_is_cons_tres(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        version: tuple[int, int] | None, ok: bool) -> None:
    """Before Slurm 23.11 an unset SelectType is select/linear (CHANGELOG/slurm-23.11.md), which the
    check refuses when written out; a 22.05 slurm.conf relying on the default passed, every job
    then holding every GPU of its nodes. The installed Slurm's version decides; unknown fails."""
    from wattclass.plugin import slurmconf

    (tmp_path / "node").mkdir()
    argv = _install(tmp_path / "node")
    conf = _slurm_conf(tmp_path)
    conf.write_text(conf.read_text().replace("SelectType=select/cons_tres\n", ""))
    monkeypatch.setattr(slurmconf, "installed_slurm_version", lambda: version)
    capsys.readouterr()
    assert main([*argv, "--slurm-conf", str(conf)]) == (0 if ok else 1)
    line = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "slurm.conf")
    assert line["ok"] is ok, line
    if not ok:
        assert "SelectType is not set" in line["detail"] and "select/cons_tres" in line["detail"]


def test_slurm_conf_includes_are_followed_and_a_loop_is_refused(tmp_path: Path) -> None:
    from wattclass.errors import WattclassError
    from wattclass.plugin.slurmconf import cap_preconditions, read_conf

    conf = _slurm_conf(tmp_path)
    (tmp_path / "nodes.conf").write_text("ProctrackType=proctrack/pgid\n")  # an Include overrides
    assert any("proctrack/pgid" in m for m in cap_preconditions(conf))
    (tmp_path / "nodes.conf").write_text("Include slurm.conf\n")
    with pytest.raises(WattclassError, match="Include nested"):
        read_conf(conf)


# Review (admin inputs): hook arguments the Prolog would reject or that disable capping.
#
# Found by reading plugin/check.py: ``plugin check`` parsed the wrappers' WATTCLASS_ARGS with
# ``parse_known_args`` (unknown options dropped), while the Prolog itself uses ``parse_args`` and
# exits 2 on them; the wrapper then exits 0 (fail-open), so every job on the node ran uncapped while
# the checklist said OK. ``install-hooks`` wrote such arguments without a word.


def _checks(capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[bool, str]]:
    out = json.loads(capsys.readouterr().out)
    return {c["name"]: (c["ok"], c["detail"]) for c in out["checks"]}


@pytest.mark.parametrize("bad", ["--stat-dir /x", "--slurm-timeout abc", "--dry-run", "--dry"])
def test_install_hooks_refuses_arguments_the_prolog_rejects_or_that_cap_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    rc = main(["plugin", "install-hooks", "--dest", str(tmp_path / "etc"), "--python", "/usr/bin/python3",
               "--hook-args", f"--backend nvml {bad}"])
    err = capsys.readouterr().err
    assert rc != 0 and "--hook-args" in err and bad.split()[0] in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "etc" / "prolog.sh").exists()


@pytest.mark.parametrize("bad", ["--stat-dir /x", "--slurm-timeout abc", "--dry-run", "--dry"])
def test_plugin_check_fails_on_wrapper_arguments_the_prolog_rejects(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    argv = _install(tmp_path)
    for kind in ("prolog", "epilog"):
        sh = tmp_path / "etc" / f"{kind}.sh"
        text = sh.read_text().replace('WATTCLASS_ARGS="', f'WATTCLASS_ARGS="{bad} ')
        sh.write_text(text)
    capsys.readouterr()
    rc = main(argv)
    got = _checks(capsys)
    assert rc == 1
    ok, detail = got["prolog wrapper"]
    assert not ok and bad.split()[0] in detail, got


@pytest.mark.parametrize(("gres", "order", "ok"), [
    ("AutoDetect=nvml\n", [1, 0], False),  # slurmd numbers in NVML order, minors differ: wrong GPUs
    ("AutoDetect=nvml\n", [0, 1], True),   # minors in NVML order: the default map holds
    ("AutoDetect=off\nName=gpu File=/dev/nvidia[0-1]\n", [1, 0], True),  # Slurm's N is /dev/nvidiaN
    (None, [1, 0], True),
])
def test_the_default_gpu_map_is_refused_where_autodetect_numbers_gpus_otherwise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], gres: str | None, order: list[int],
        ok: bool) -> None:
    """With gres.conf AutoDetect=nvml slurmd's GPU index is the NVML index (gres_gpu.c sorts by
    the NVLink matrix), not the /dev/nvidiaN minor the default map assumes: the Prolog would cap
    another job's GPU and leave the job's own uncapped."""
    (tmp_path / "node").mkdir()
    argv = _install(tmp_path / "node")
    be = FileStateBackend.create(tmp_path / "node" / "gpus.json", 2, order=order)
    conf = _slurm_conf(tmp_path)
    if gres is not None:
        (tmp_path / "gres.conf").write_text(gres)
    capsys.readouterr()
    assert main([*argv, "--slurm-conf", str(conf)]) == (0 if ok else 1)
    line = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "GPU map")
    assert line["ok"] is ok, line
    if not ok:
        assert "AutoDetect=nvml" in line["detail"] and be.gpus()[0].pci_bus_id in line["detail"], line


def test_an_explicit_gpu_map_must_name_gpus_of_this_node(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "node"
    root.mkdir()
    _install(root)
    be = FileStateBackend.create(root / "gpus.json", 2, order=[1, 0])
    gpu_map = root / "gpumap.json"
    etc = root / "etc"
    (tmp_path / "gres.conf").write_text("AutoDetect=nvml\n")
    conf = _slurm_conf(tmp_path)
    for mapping, ok in (({str(g.gpu_index): g.pci_bus_id for g in be.gpus()}, True),
                        ({"0": "00000000:AA:00.0"}, False)):
        gpu_map.write_text(json.dumps(mapping))
        args = f"--backend filestate:{root / 'gpus.json'} --state-dir {root / 'run' / 'caps'} " \
               f"--jobs-dir {root / 'run' / 'jobs'} --log {root / 'plugin.log'} --gpu-map {gpu_map}"
        assert main(["plugin", "install-hooks", "--dest", str(etc), "--python", sys.executable,
                     "--hook-args", args]) == 0
        capsys.readouterr()
        main(["plugin", "check", "--hooks-dir", str(etc), "--policy", str(etc / "policy.toml"),
              "--table", str(etc / "labels.tsv"), "--json", "--slurm-conf", str(conf)])
        line = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "GPU map")
        assert line["ok"] is ok, line


def test_a_compute_node_without_the_controllers_files_passes_as_a_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The Prolog and Epilog read neither the policy nor the label table: on a compute node that
    # lacks them, `plugin check` failed a correct install. --role node checks what the hooks use.
    argv = _install(tmp_path)
    (tmp_path / "etc" / "policy.toml").unlink()
    (tmp_path / "etc" / "labels.tsv").unlink()
    capsys.readouterr()
    assert main(argv) == 1 and not _result(capsys)["policy"]
    assert main([*argv, "--role", "node"]) == 0
    got = _result(capsys)
    assert all(got.values()) and "policy" not in got and "label table" not in got and "GPU backend" in got


def test_the_controller_role_checks_the_policy_and_table_not_the_hooks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _install(tmp_path)
    (tmp_path / "etc" / "prolog.sh").unlink()
    (tmp_path / "etc" / "epilog.sh").unlink()
    capsys.readouterr()
    assert main([*argv, "--role", "controller"]) == 0
    assert set(_result(capsys)) == {"policy", "label table"}
    (tmp_path / "etc" / "labels.tsv").chmod(0o664)  # group-writable: refused
    assert main([*argv, "--role", "controller"]) == 1 and not _result(capsys)["label table"]


@pytest.mark.parametrize(("squeue", "daemon", "named"), [
    ("25.11.7", (25, 11), None),
    (None, (25, 11), "--slurm-bin"),  # no squeue where the hooks look: every job uncapped
    ("22.05.8", (25, 11), "22.05"),  # another version than the daemons': fails against slurmctld
    # a squeue a non-root user owns: the hooks refuse to run it as root (every job uncapped)
    ("25.11.7 user", (25, 11), "refuses to run"),
])
def test_slurm_conf_check_also_finds_the_squeue_the_hooks_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        squeue: str | None, daemon: tuple[int, int], named: str | None) -> None:
    """The Prolog reads each job's decision with squeue from --slurm-bin (else the wrapper's PATH,
    /usr/bin): a site whose Slurm lives in /opt/slurm/bin and forgot --slurm-bin, or pointed it at
    a folder without squeue, had every job on the node uncapped (an ERROR per job in plugin.log)
    while `plugin check --slurm-conf` printed every line OK."""
    from wattclass.plugin import slurmconf

    node = tmp_path / "node"
    node.mkdir()
    argv = _install(node)
    slurm_bin = tmp_path / "slurm" / "bin"
    slurm_bin.mkdir(parents=True)
    if squeue is not None:
        (slurm_bin / "squeue").write_text(f"#!/bin/sh\necho 'slurm {squeue.split()[0]}'\n")
        (slurm_bin / "squeue").chmod(0o755)
        if squeue.endswith(" user"):
            os.chown(slurm_bin / "squeue", 65534, 65534)
    etc = node / "etc"
    args = f"--backend filestate:{node / 'gpus.json'} --state-dir {node / 'run' / 'caps'} " \
           f"--jobs-dir {node / 'run' / 'jobs'} --log {node / 'plugin.log'} --slurm-bin {slurm_bin}"
    assert main(["plugin", "install-hooks", "--dest", str(etc), "--python", sys.executable,
                 "--hook-args", args]) == 0
    conf = _slurm_conf(tmp_path)
    monkeypatch.setattr(slurmconf, "installed_slurm_version", lambda: daemon)
    capsys.readouterr()
    rc = main([*argv, "--role", "node", "--slurm-conf", str(conf)])
    line = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "Slurm client")
    assert (rc == 0) is (named is None) and line["ok"] is (named is None), line
    assert str(slurm_bin / "squeue") in line["detail"]
    if named is not None:
        assert named in line["detail"], line


@pytest.mark.parametrize(("slurm_user", "group", "ok"), [
    ("root", "nogroup", True),  # root reads anything
    ("nobody", "nogroup", True),  # nobody's primary group is nogroup
    ("daemon", "nogroup", False),  # the table's group is not daemon's: slurmctld cannot read it
])
def test_controller_check_fails_a_table_slurmctld_cannot_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_user: str, group: str, ok: bool) -> None:
    """A 0640 table whose group is not SlurmUser's leaves every job as submitted (slurmctld logs it
    at every submission), while `plugin check` said OK ("0640, group 65534 only"): with
    --slurm-conf the controller check reads SlurmUser and asks whether that user can read it."""
    import grp

    argv = _install(tmp_path)
    table = tmp_path / "etc" / "labels.tsv"
    os.chown(table, 0, grp.getgrnam(group).gr_gid)
    table.chmod(0o640)
    conf = _slurm_conf(tmp_path, f"SlurmUser={slurm_user}\n")
    capsys.readouterr()
    main([*argv, "--role", "controller", "--slurm-conf", str(conf)])
    line = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "label table")
    assert line["ok"] is ok, line
    assert group in line["detail"], line  # the group by name, not a number
    if not ok:
        assert f"SlurmUser={slurm_user}" in line["detail"] and "--table-group" in line["detail"], line


def test_missing_wrappers_say_how_to_install_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node checked before `install-hooks` (or with the wrappers elsewhere) got "[Errno 2] No
    such file or directory: '(none)'" for the interpreter and a raw errno for the epilog: each
    line now names the missing file and the command (or --hooks-dir) that fixes it."""
    argv = _install(tmp_path)
    (tmp_path / "etc" / "prolog.sh").unlink()
    (tmp_path / "etc" / "epilog.sh").unlink()
    capsys.readouterr()
    assert main([*argv, "--role", "node"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    for name in ("prolog wrapper", "epilog wrapper", "hook interpreter"):
        line = checks[name]
        assert not line["ok"] and "install-hooks" in line["detail"] and "--hooks-dir" in line["detail"], line
        assert "(none)" not in line["detail"] and "Errno" not in line["detail"], line


@pytest.mark.parametrize("command", ["install-hooks", "install-lua"])
@pytest.mark.parametrize("where", ["others_write_the_folder", "others_write_a_folder_above", "symlink"])
def test_install_refuses_a_destination_others_can_change(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          command: str, where: str) -> None:
    """slurmd runs the wrappers as root and slurmctld loads job_submit.lua: `install-hooks` and
    `install-lua` wrote them into a folder any user could write (or rename from above), and said
    "wrote"; only a later `plugin check` refused it. They now refuse such a --dest, naming it,
    and write nothing."""
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    if where == "others_write_the_folder":
        shared.chmod(0o777)
        dest = shared
    elif where == "others_write_a_folder_above":
        shared.chmod(0o777)
        dest = shared / "slurm" / "wattclass"  # made by the command: anyone could rename it later
    else:
        real = tmp_path / "real"
        real.mkdir(mode=0o755)
        (shared / "link").symlink_to(real)
        dest = shared / "link"
    argv = (["plugin", "install-hooks", "--dest", str(dest), "--python", sys.executable]
            if command == "install-hooks" else
            ["plugin", "install-lua", "--dest", str(dest / "job_submit.lua"), "--table", "/etc/labels.tsv"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "refusing" in err and str(shared) in err, err
    assert not list(tmp_path.rglob("*.sh")) and not list(tmp_path.rglob("*.lua"))
