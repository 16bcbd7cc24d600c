"""Prolog/Epilog pieces on the filestate backend (the real-Slurm path is in test_slurm_hooks.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wattclass.caps import Cap
from wattclass.errors import ConfigError, GpuError, SlurmError
from wattclass.gpu import open_backend
from wattclass.gpu.filestate import FileStateBackend
from wattclass.jobmap import read_job_file
from wattclass.plugin.install import render_hook, render_job_submit
from wattclass.plugin.prolog import (
    discover_gpu_map,
    epilog,
    parse_admin_comment,
    prolog,
    reconcile,
    resolve_gpus,
)
from wattclass.slurm.commands import run_slurm

MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"
MAP = {str(j): f"00000000:{0x19 + 0x10 * j:02X}:00.0" for j in range(4)}


def test_parse_admin_comment() -> None:
    c = parse_admin_comment(f"ops-note {MEM}")
    assert c is not None and (c.label, c.cap, c.mode) == ("memory", Cap(60.0, "%"), "enforce")
    for bad in [None, "", "label=memory", MEM.replace("memory", "fast"), MEM.replace("60%", "160%"),
                MEM + ";cap=100%", MEM.replace("mode=enforce", "mode=on"), "wattclass:garbage"]:
        assert parse_admin_comment(bad) is None, bad


def test_filestate_rejects_limits_outside_min_max(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    with pytest.raises(GpuError, match="outside"):
        be.set_power_limit_w(0, 150.0)
    be.set_power_limit_w(1, 300.0)
    assert open_backend(f"filestate:{tmp_path / 'g.json'}").power_limit_w(1) == 300.0


def test_default_gpu_map_comes_from_minor_numbers(tmp_path: Path) -> None:
    """Slurm's index N is /dev/nvidiaN: the map follows the minor numbers, not NVML's order."""
    be = FileStateBackend.create(tmp_path / "g.json", 4, order=[3, 2, 1, 0])
    gpu_map = discover_gpu_map(be)
    assert gpu_map == {str(3 - i): be.gpus()[i].uuid for i in range(4)}
    assert [g.gpu_index for g in resolve_gpus(be, "0,1", gpu_map)] == [3, 2]


def test_prolog_maps_by_bus_id_caps_and_epilog_restores(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 4, order=[3, 2, 1, 0], default_w=700, min_w=300)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,3", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000"}
    plan = prolog(env, be, lambda _j: MEM, MAP, tmp_path / "jobs", tmp_path / "caps")
    assert {p["gpu_index"] for p in plan} == {3, 0}  # Slurm 0 -> bus 0 -> backend GPU 3
    assert [p["target_w"] for p in plan] == [420.0, 420.0]
    assert [be.power_limit_w(i) for i in range(4)] == [420.0, 700.0, 700.0, 420.0]
    job = read_job_file(tmp_path / "jobs" / be.gpus()[3].uuid / "42.json")
    assert job is not None and (job.job_id, job.user, job.uid) == ("42", "alice", 1000)
    assert epilog(env, be, tmp_path / "jobs", tmp_path / "caps") == sorted(
        [be.gpus()[0].uuid, be.gpus()[3].uuid])
    assert [be.power_limit_w(i) for i in range(4)] == [700.0] * 4
    assert epilog(env, be, tmp_path / "jobs", tmp_path / "caps") == []
    assert not list((tmp_path / "jobs").rglob("*.json"))


def test_cap_below_min_is_clamped_and_stale_record_keeps_original(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 1, min_w=500)
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"}
    prolog(env, be, lambda _j: MEM, {"0": be.gpus()[0].uuid}, tmp_path / "j", tmp_path / "c")
    assert be.power_limit_w(0) == 500.0  # 60% of 700 = 420 < min 500
    # job 7's Epilog has not run (yet); job 8 starts on the same GPU. Since shared GPUs (issue 16)
    # job 7 counts as a neighbour until its Epilog (or reconcile at boot) removes it.
    prolog({**env, "SLURM_JOB_ID": "8"}, be, lambda _j: MEM, {"0": be.gpus()[0].uuid}, tmp_path / "j",
           tmp_path / "c")
    epilog({**env, "SLURM_JOB_ID": "8"}, be, tmp_path / "j", tmp_path / "c")
    assert be.power_limit_w(0) == 500.0  # job 7 still holds it
    epilog(env, be, tmp_path / "j", tmp_path / "c")
    assert be.power_limit_w(0) == 700.0  # the original, not job 7's cap


@pytest.mark.parametrize("comment", ["shadow", "uncapped", "none"])
def test_files_of_a_job_that_left_without_its_epilog_go_in_every_mode(tmp_path: Path, comment: str) -> None:
    """Not only a capping Prolog drops them: in shadow mode, or for a job with no cap and no
    record, a stale job file would make the telemetry daemon split this job's windows with a job
    that no longer runs (the first weeks of every rollout are shadow mode)."""
    from wattclass.jobmap import JobAssignment, job_path, jobs_on_gpu, write_job_file

    be = FileStateBackend.create(tmp_path / "g.json", 3)
    uuids = [g.uuid for g in be.gpus()]
    gmap = {"0": uuids[0], "1": uuids[1]}
    jobs = tmp_path / "j"
    jobs.mkdir(mode=0o755)
    for u in uuids:  # on the job's GPUs and on one it does not hold
        for other in ("555", "556", "557"):
            write_job_file(jobs, u, JobAssignment(other, "bob", 1001))
            os.utime(job_path(jobs, u, other), (1.0e9, 1.0e9))  # written when those jobs started
    answers = {"555": True, "556": False, "557": None}  # ended, runs here, Slurm cannot tell
    asked: list[str] = []

    def ended(j: str) -> bool | None:
        asked.append(j)
        return answers[j]
    text = {"shadow": MEM.replace("enforce", "shadow"), "uncapped": MEM.replace("cap=60%;", ""),
            "none": None}[comment]
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_USER": "alice"}
    prolog(env, be, lambda _j: text, gmap, jobs, tmp_path / "c", job_ended=ended)
    assert sorted(asked) == ["555", "556", "557"]  # once each, whatever the number of GPUs
    for u in uuids:
        held = {a.job_id for a in jobs_on_gpu(jobs, u)}
        assert held == ({"9", "556", "557"} if u in gmap.values() else {"556", "557"}), (u, held)
    assert [be.power_limit_w(i) for i in range(3)] == [700.0] * 3
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").glob("*.json"))


def test_shadow_and_dry_run_change_nothing(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1"}
    gmap = {"0": be.gpus()[0].uuid, "1": be.gpus()[1].uuid}
    shadow = MEM.replace("enforce", "shadow")
    plan = prolog(env, be, lambda _j: shadow, gmap, tmp_path / "j", tmp_path / "c")
    assert [p["action"] for p in plan] == ["shadow", "shadow"]
    assert not any((tmp_path / "c").glob("*.json"))  # joins records only: none to join here
    plan = prolog(env, be, lambda _j: MEM, gmap, tmp_path / "j2", tmp_path / "c2", dry_run=True)
    assert [(p["action"], p["target_w"]) for p in plan] == [("dry-run", 420.0)] * 2
    assert not (tmp_path / "j2").exists() and not (tmp_path / "c2").exists()
    assert [be.power_limit_w(i) for i in range(2)] == [700.0, 700.0]


def test_reconcile_restores_record_or_default(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0"}
    prolog(env, be, lambda _j: MEM, {"0": be.gpus()[0].uuid}, tmp_path / "j", tmp_path / "c")
    (tmp_path / "j" / be.gpus()[0].uuid / "5.json").unlink()  # the node rebooted: no job holds it
    be.set_power_limit_w(1, 250.0)
    done = reconcile(be, tmp_path / "j", tmp_path / "c")
    assert sorted(d["action"] for d in done) == ["default", "restored"]
    assert [be.power_limit_w(i) for i in range(2)] == [700.0, 700.0]


def test_reconcile_goes_on_past_a_gpu_it_cannot_set(tmp_path: Path) -> None:
    """At boot, one GPU whose limit cannot be set stopped reconcile: the GPUs after it stayed at
    the crashed jobs' caps."""
    FileStateBackend.create(tmp_path / "g.json", 3)
    for i in range(3):
        FileStateBackend(tmp_path / "g.json").set_power_limit_w(i, 420.0)  # caps of a crashed node
    be = _LostGpu0(tmp_path / "g.json")
    with pytest.raises(GpuError, match="GPU_IS_LOST"):  # still reported: the unit exits 1
        reconcile(be, tmp_path / "j", tmp_path / "c")
    assert [be.power_limit_w(i) for i in (1, 2)] == [700.0, 700.0]


def test_hook_entry_point_exits_zero_on_errors(tmp_path: Path) -> None:
    env = dict(os.environ, SLURM_JOB_ID="11", SLURM_JOB_GPUS="0")
    for args in (["--backend", f"filestate:{tmp_path / 'missing.json'}"],
                 ["--backend", "bogus"],
                 ["--backend", f"filestate:{tmp_path / 'missing.json'}", "--admin-comment", MEM]):
        proc = subprocess.run([sys.executable, "-m", "wattclass.plugin.prolog", "prolog", *args,
                               "--log", str(tmp_path / "p.log")], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p.log").read_text().count("job 11: prolog failed") == 3


def test_epilog_with_a_broken_backend_still_removes_the_job_files(tmp_path: Path) -> None:
    """A stale job file would count as a live, uncapped neighbour for every later job on the GPU."""
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000"}
    prolog(env, be, lambda _j: MEM, MAP, tmp_path / "jobs", tmp_path / "caps")
    assert list((tmp_path / "jobs").rglob("42.json"))
    (tmp_path / "g.json").write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "wattclass.plugin.prolog", "epilog", "--backend",
                           f"filestate:{tmp_path / 'g.json'}", "--jobs-dir", str(tmp_path / "jobs"),
                           "--state-dir", str(tmp_path / "caps"), "--log", str(tmp_path / "e.log")],
                          env=dict(os.environ, **env), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "job 42: epilog failed" in (tmp_path / "e.log").read_text()
    assert not list((tmp_path / "jobs").rglob("42.json"))
    assert list((tmp_path / "caps").glob("*.json"))  # the cap record stays for reconcile


def test_prolog_does_not_import_pandas() -> None:
    code = ("import sys, wattclass.plugin.prolog, wattclass.slurm.commands; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_run_slurm_errors_name_the_command() -> None:
    with pytest.raises(SlurmError, match="no-such-slurm-cmd"):
        run_slurm(["no-such-slurm-cmd", "--json"])
    with pytest.raises(SlurmError, match=r"false: exit 1"):
        run_slurm(["false"])
    with pytest.raises(SlurmError, match="no answer within"):
        run_slurm(["sleep", "5"], timeout=0.2)


def test_render_files_reject_injection(tmp_path: Path) -> None:
    lua = render_job_submit('/x/"; os.execute("rm -rf /") --.lua')
    assert 'local LABEL_TABLE = "/x/\\034; os.execute(\\034rm -rf /\\034) --.lua"' in lua
    with pytest.raises(ConfigError):
        render_hook("prolog", "python3", [])
    with pytest.raises(ConfigError):
        render_hook("prolog", "/usr/bin/python3", ["--log", "/tmp/x; rm -rf /"])
    sh = render_hook("prolog", "/usr/bin/python3", ["--backend", "nvml"])
    assert 'WATTCLASS_ARGS="--backend nvml"' in sh and sh.rstrip().endswith("exit 0")


# -- issue 9 items 11 and 12: untrusted state, bad records ----------------------------------------------
def _capped(tmp_path: Path, n: int = 3) -> tuple[FileStateBackend, dict[str, str], dict[str, str]]:
    be = FileStateBackend.create(tmp_path / "g.json", n)
    gmap = {str(i): be.gpus()[i].uuid for i in range(n)}
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": ",".join(gmap)}
    prolog(env, be, lambda _j: MEM, gmap, tmp_path / "jobs", tmp_path / "caps")
    assert [be.power_limit_w(i) for i in range(n)] == [420.0] * n
    return be, gmap, env


@pytest.mark.parametrize("bad", ["null", "corrupt", "string"])
def test_one_bad_cap_record_does_not_strand_the_other_gpus(tmp_path: Path, bad: str) -> None:
    be, gmap, env = _capped(tmp_path)
    rec = tmp_path / "caps" / f"{be.gpus()[1].uuid}.json"
    doc = json.loads(rec.read_text())
    if bad == "null":
        doc["previous_w"] = None
        rec.write_text(json.dumps(doc))
    elif bad == "corrupt":
        rec.write_text("{not json")
    else:
        doc["previous_w"] = "700"
        rec.write_text(json.dumps(doc))
    with contextlib.suppress(GpuError):
        epilog(env, be, tmp_path / "jobs", tmp_path / "caps", gmap)
    assert [be.power_limit_w(i) for i in range(3)] == [700.0] * 3  # the bad one went to its default
    assert not list((tmp_path / "caps").glob("*.json"))


class _LostGpu0(FileStateBackend):
    """GPU 0 has fallen off the bus: NVML refuses to set its limit."""

    def set_power_limit_w(self, index: int, watts: float) -> None:
        if index == 0:
            raise GpuError("GPU 0: NVML_ERROR_GPU_IS_LOST")
        super().set_power_limit_w(index, watts)


@pytest.mark.parametrize("bad", ["lost", "untrusted record"])
def test_one_gpu_that_cannot_be_capped_does_not_leave_the_others_uncapped(tmp_path: Path, bad: str) -> None:
    """Fail safe for caps: the Prolog used to stop at the first GPU that failed, so an 8-GPU memory
    job ran with 7 GPUs uncapped because one GPU (or its record) was bad."""
    FileStateBackend.create(tmp_path / "g.json", 3)
    be = _LostGpu0(tmp_path / "g.json") if bad == "lost" else FileStateBackend(tmp_path / "g.json")
    gmap = {str(i): be.gpus()[i].uuid for i in range(3)}
    if bad == "untrusted record":  # e.g. an admin's chmod: the record of GPU 0 is refused
        (tmp_path / "caps").mkdir()
        rec = tmp_path / "caps" / f"{be.gpus()[0].uuid}.json"
        rec.write_text(json.dumps({"version": 2, "previous_w": 700.0, "jobs": {}, "set_w": 700.0}))
        rec.chmod(0o666)
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1,2"}
    plan = prolog(env, be, lambda _j: MEM, gmap, tmp_path / "jobs", tmp_path / "caps")
    assert [p["action"] for p in plan] == ["error", "capped", "capped"]
    assert [be.power_limit_w(i) for i in (1, 2)] == [420.0, 420.0]
    with contextlib.suppress(GpuError):  # GPU 0 is still lost
        epilog(env, be, tmp_path / "jobs", tmp_path / "caps", gmap)
    assert [be.power_limit_w(i) for i in (1, 2)] == [700.0, 700.0]


def test_nobody_owned_state_folder_is_refused_and_the_job_gpus_go_to_default(tmp_path: Path) -> None:
    be, gmap, env = _capped(tmp_path, 2)
    caps = tmp_path / "caps"
    # a planted record in a folder nobody owns asks to leave GPU 0 at 200 W after the job
    os.chown(caps, 65534, 65534)
    rec = caps / f"{be.gpus()[0].uuid}.json"
    rec.write_text(json.dumps({"version": 1, "job_id": "9", "previous_w": 200.0, "set_w": 420.0}))
    epilog(env, be, tmp_path / "jobs", caps, gmap)
    assert [be.power_limit_w(i) for i in range(2)] == [700.0, 700.0]
    # and the Prolog refuses to record caps there (the job runs uncapped, the error is logged)
    with pytest.raises(ConfigError, match="owned by uid 65534"):
        prolog({**env, "SLURM_JOB_ID": "10"}, be, lambda _j: MEM, gmap, tmp_path / "jobs", caps)


def test_a_sticky_state_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    """A sticky, world-writable state folder (``--state-dir /tmp``: mode 1777) passed the trust
    check, so a user could make the names root uses first: a record they own for each GPU (the
    Prolog refused it and left that GPU uncapped), or a ``<gpu>.lock`` they hold (every hook on the
    GPU waits forever). Sticky is fine above the folder, not for the folder root creates files in."""
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    gmap = {str(i): be.gpus()[i].uuid for i in range(2)}
    caps = tmp_path / "caps"
    caps.mkdir()
    caps.chmod(0o1777)
    for g in be.gpus():  # planted by uid 65534 before any job
        planted = caps / f"{g.uuid}.json"
        planted.write_text("{}")
        os.chown(planted, 65534, 65534)
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1"}
    with pytest.raises(ConfigError, match="others can write"):  # refused up front, loudly
        prolog(env, be, lambda _j: MEM, gmap, tmp_path / "jobs", caps)
    from wattclass.plugin.check import _check_dir

    with pytest.raises(ConfigError, match="others can write"):  # and `wattclass plugin check` says so
        _check_dir(caps, creates=True)
    _check_dir(tmp_path, creates=False)  # a sticky folder above is still fine (/tmp)
    # nor may others write the folder the hooks would make a missing state folder in (--state-dir
    # /tmp/wattclass/caps): a user could make that name first, and the hooks refuse their folder
    with pytest.raises(ConfigError, match="others can write"):
        _check_dir(caps / "wattclass" / "caps", creates=True)
    assert "does not exist yet" in _check_dir(tmp_path / "new" / "caps", creates=True)
    # the Epilog believes nothing in it: the job's GPUs go to their default limit
    be.set_power_limit_w(0, 420.0)
    epilog(env, be, tmp_path / "jobs", caps, gmap)
    assert [be.power_limit_w(i) for i in range(2)] == [700.0, 700.0]


def test_symlinked_cap_record_is_not_trusted(tmp_path: Path) -> None:
    be, gmap, env = _capped(tmp_path, 1)
    caps = tmp_path / "caps"
    rec = caps / f"{be.gpus()[0].uuid}.json"
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps({"version": 1, "job_id": "9", "previous_w": 200.0}))
    rec.unlink()
    rec.symlink_to(elsewhere)
    epilog(env, be, tmp_path / "jobs", caps, gmap)
    assert be.power_limit_w(0) == 700.0  # default, not the planted 200 W


def test_hook_log_lines_clip_user_strings(tmp_path: Path) -> None:
    """Issue 9 item 14, Python side: a huge, multi-line value in a hook log line stays one short line."""
    import logging

    from wattclass.plugin.prolog import setup_log

    log_path = tmp_path / "hook.log"
    setup_log(log_path, stderr=False)
    setup_log(tmp_path / "second.log", stderr=False)  # two handlers: clipped once, not twice
    try:
        logging.getLogger("wattclass.plugin.prolog").error("job %s: %s", 5, "x\nFORGED line " + "%" * 100_000)
    finally:
        root = logging.getLogger("wattclass")
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
    text = log_path.read_text()
    assert text.count("\n") == 1 and len(text) < 600, len(text)
    assert "x\\x0aFORGED" in text and "(100014 chars)" in text
    assert (tmp_path / "second.log").read_text() == text

def test_prolog_writes_dcgm_exporter_job_mapping_and_the_label(tmp_path: Path) -> None:
    """--hpc-job-mapping-dir: one file per GPU index holding the job id (dcgm-exporter's format);
    the Epilog removes only its own job's files. The job file also carries the submitted label."""
    be = FileStateBackend.create(tmp_path / "g.json", 4, order=[3, 2, 1, 0], default_w=700, min_w=300)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,3", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000",
           "SLURM_JOB_ACCOUNT": "physics"}
    hpc = tmp_path / "hpc"
    prolog(env, be, lambda _j: MEM, MAP, tmp_path / "jobs", tmp_path / "caps", hpc_job_dir=hpc)
    assert sorted(p.name for p in hpc.iterdir()) == ["0", "3"]  # backend (NVML/DCGM) indices
    assert (hpc / "3").read_text() == "42\n" and oct((hpc / "3").stat().st_mode & 0o777) == "0o644"
    from wattclass.jobmap import job_path

    job = read_job_file(job_path(tmp_path / "jobs", be.gpus()[3].uuid, "42"))
    assert job is not None and (job.label, job.label_source, job.account) == ("memory", "rule", "physics")
    (hpc / "1").write_text("77\n")  # another job's GPU
    (hpc / "0").write_text("42\n55\n")  # a shared GPU: another job stays named
    epilog(env, be, tmp_path / "jobs", tmp_path / "caps", hpc_job_dir=hpc)
    assert sorted(p.name for p in hpc.iterdir()) == ["0", "1"]
    assert (hpc / "0").read_text() == "55\n"


@pytest.mark.parametrize("change", ["add", "remove"])
def test_dcgm_job_mapping_is_rewritten_under_a_lock_on_its_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """Hooks of jobs sharing a GPU run at once: each rewrite of a mapping file holds an exclusive
    lock on the folder from its read to its write, so another hook's change is never lost (a
    new job missing, or an ended job written back after its Epilog removed it)."""
    from flock_probe import flock_held

    from wattclass import jobmap

    hpc = tmp_path / "hpc"
    hpc.mkdir()
    (hpc / "0").write_text("41\n42\n")
    blocked: list[bool] = []
    read = jobmap._hpc_jobs

    def read_while_another_hook_tries(path: Path) -> list[str]:
        blocked.append(flock_held(hpc, os.O_RDONLY | os.O_DIRECTORY))
        return read(path)

    monkeypatch.setattr(jobmap, "_hpc_jobs", read_while_another_hook_tries)
    if change == "add":
        jobmap.write_hpc_job_file(hpc, 0, "43")
        assert (hpc / "0").read_text() == "41\n42\n43\n"
    else:
        assert jobmap.remove_hpc_job_file(hpc, 0, "41")
        assert (hpc / "0").read_text() == "42\n"
    assert blocked == [True]


@pytest.mark.parametrize(("mode", "arm", "capped"), [
    ("shadow", "capped", True), ("shadow", "control", False), ("enforce", "control", False),
    ("enforce", "capped", True), ("shadow", None, False), ("enforce", None, True)])
def test_prolog_honours_the_canary_arm(tmp_path: Path, mode: str, arm: str | None, capped: bool) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 1)
    comment = MEM.replace("mode=enforce", f"mode={mode}") + (f";arm={arm}" if arm else "")
    plan = prolog({"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0"}, be, lambda _j: comment,
                  {"0": be.gpus()[0].uuid}, tmp_path / "j", tmp_path / "c")
    assert plan[0]["arm"] == arm
    assert be.power_limit_w(0) == (420.0 if capped else 700.0)
    assert plan[0]["action"] == ("capped" if capped else "control" if arm == "control" else "shadow")
    assert parse_admin_comment(comment.replace(f"arm={arm}", "arm=maybe")) is None or arm is None


def test_a_job_back_on_the_node_after_slurm_was_asked_keeps_its_new_files(tmp_path: Path) -> None:
    """Slurm is asked first and files go later: a requeued job placed back on this node in
    between (pending when asked) writes new files, which must stay."""
    from wattclass.jobmap import JobAssignment, job_path, jobs_on_gpu, write_job_file

    be = FileStateBackend.create(tmp_path / "g.json", 3)
    uuids = [g.uuid for g in be.gpus()]
    jobs = tmp_path / "j"
    jobs.mkdir(mode=0o755)
    for u in uuids:
        write_job_file(jobs, u, JobAssignment("555", "bob", 1001))
        os.utime(job_path(jobs, u, "555"), (1.0e9, 1.0e9))  # written long before

    def ended(j: str) -> bool | None:
        write_job_file(jobs, uuids[2], JobAssignment("555", "bob", 1001))  # restarted here meanwhile
        # stamped as the kernel's coarse clock may stamp it: a tick behind time.time() (it failed
        # so once in CI, by chance; here always)
        now = time.time() - 0.02
        os.utime(job_path(jobs, uuids[2], "555"), (now, now))
        return True  # pending when asked: not running on this node
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_USER": "alice"}
    prolog(env, be, lambda _j: MEM, {"0": uuids[0], "1": uuids[1]}, jobs, tmp_path / "c", job_ended=ended)
    held = {u: {a.job_id for a in jobs_on_gpu(jobs, u)} for u in uuids}
    assert held == {uuids[0]: {"9"}, uuids[1]: {"9"}, uuids[2]: {"555"}}, held


def test_a_malformed_wattclass_token_is_logged_as_an_error(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    # only job_submit.lua or an administrator writes admin_comment; a token nobody can read means
    # an uncapped job, which the sysadmin must see (review finding)
    be = FileStateBackend.create(tmp_path / "g.json", 4, order=[3, 2, 1, 0], default_w=700, min_w=300)
    env = {"SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "0", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000"}
    bad = MEM.replace("label=memory", "label=memory;label=compute")
    with caplog.at_level(logging.ERROR, logger="wattclass"):
        plan = prolog(env, be, lambda _j: bad, MAP, tmp_path / "jobs", tmp_path / "caps")
    assert [p["action"] for p in plan] == ["none"] and be.power_limit_w(3) == 700.0
    assert any("job 43: malformed wattclass token" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="wattclass"):
        prolog({**env, "SLURM_JOB_ID": "44"}, be, lambda _j: "ops note, no token", MAP, tmp_path / "jobs",
               tmp_path / "caps")
    assert not caplog.records  # no wattclass token at all: nothing to report
    # root's scontrol update re-decided the job to no decision (job_submit.lua's modify writes this
    # token, as Slurm ignores an empty admin_comment): nothing wrong, no ERROR in syslog every job
    with caplog.at_level(logging.ERROR, logger="wattclass"):
        plan = prolog({**env, "SLURM_JOB_ID": "45"}, be,
                      lambda _j: "ops note wattclass:decision=none;reason=exempt_partition", MAP,
                      tmp_path / "jobs", tmp_path / "caps")
    assert [p["action"] for p in plan] == ["none"] and not caplog.records


def test_an_unusable_dcgm_exporter_mapping_folder_does_not_cost_the_cap(tmp_path: Path) -> None:
    """The optional dcgm-exporter mapping was written before the decision was read: a mapping
    folder the Prolog refuses (owned by the exporter's user, say) left every job uncapped."""
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    gmap = {str(i): be.gpus()[i].uuid for i in range(2)}
    hpc = tmp_path / "hpc"
    hpc.mkdir()
    os.chown(hpc, 65534, 65534)
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1"}
    plan = prolog(env, be, lambda _j: MEM, gmap, tmp_path / "jobs", tmp_path / "caps", hpc_job_dir=hpc)
    assert [p["action"] for p in plan] == ["capped", "capped"]
    assert [be.power_limit_w(i) for i in range(2)] == [420.0, 420.0]
    assert not list(hpc.iterdir())  # nothing written into the refused folder


@pytest.mark.parametrize("bad", ["symlink", "fifo", "folder others can write"])
def test_the_hook_log_is_opened_as_root_trusts_a_path(tmp_path: Path, bad: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The hooks appended to ``--log`` as root following symlinks: whoever could write the log's
    folder could make root append to any file (a link to /etc/passwd) or hang every hook (a FIFO)."""
    from wattclass.plugin.prolog import setup_log

    logs, victim = tmp_path / "logs", tmp_path / "passwd"
    logs.mkdir()
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    if bad == "symlink":
        (logs / "plugin.log").symlink_to(victim)
    elif bad == "fifo":
        os.mkfifo(logs / "plugin.log")
    else:
        logs.chmod(0o777)
    root = logging.getLogger("wattclass")
    try:
        setup_log(logs / "plugin.log", stderr=False)  # returns: no block on the FIFO
        logging.getLogger("wattclass.plugin.prolog").error("job %s: planted line", 5)
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
    assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert "ERROR hook log" in capsys.readouterr().err  # the wrappers send it to syslog
    if bad == "folder others can write":
        assert not (logs / "plugin.log").exists()


@pytest.mark.parametrize("bad", ["not in the map", "gone from the backend"])
def test_a_gpu_that_cannot_be_resolved_does_not_leave_the_others_uncapped(tmp_path: Path, bad: str) -> None:
    """Resolving SLURM_JOB_GPUS stopped at the first GPU it could not map: a GPU fallen off the
    bus (NVML no longer lists it, Slurm still hands it out) or missing from the map left every
    GPU of the job uncapped."""
    be = FileStateBackend.create(tmp_path / "g.json", 3)
    gmap = {str(i): be.gpus()[i].uuid for i in range(3)}
    if bad == "not in the map":
        del gmap["1"]
    else:
        gmap["1"] = "GPU-00000000-dead-4000-8000-000000000000"
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0,1,2"}
    plan = prolog(env, be, lambda _j: MEM, gmap, tmp_path / "jobs", tmp_path / "caps")
    assert [p["gpu_index"] for p in plan] == [0, 2]
    assert [be.power_limit_w(i) for i in range(3)] == [420.0, 700.0, 420.0]
    # the state folder is untrusted at the Epilog: the GPUs it can map still go to their default
    os.chown(tmp_path / "caps", 65534, 65534)
    epilog(env, be, tmp_path / "jobs", tmp_path / "caps", gmap)
    assert [be.power_limit_w(i) for i in range(3)] == [700.0, 700.0, 700.0]


def test_reconcile_on_a_live_node_never_undoes_a_prolog_that_runs_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`systemctl restart wattclass-reconcile` on a node that runs jobs (docs/admin.md, install and
    rollback): reconcile read "no job on this GPU", a Prolog then capped it, and reconcile restored
    the GPU from that fresh record and removed it: the job ran uncapped, with no record for its
    Epilog (found in review). Reconcile now holds the GPU's lock, as the hooks do."""
    import threading

    import wattclass.plugin.prolog as hooks

    be = FileStateBackend.create(tmp_path / "g.json", 1)
    uuid = be.gpus()[0].uuid
    (tmp_path / "c").mkdir(mode=0o755)
    real = hooks.jobs_on_gpu
    started: list[threading.Thread] = []

    def check_then_a_prolog_starts(spool: Path, gpu: str):  # type: ignore[no-untyped-def]
        found = real(spool, gpu)
        if not started and threading.current_thread() is threading.main_thread():
            t = threading.Thread(target=prolog, args=({"SLURM_JOB_ID": "8", "SLURM_JOB_GPUS": "0"}, be,
                                                      lambda _j: MEM, {"0": uuid}, tmp_path / "j",
                                                      tmp_path / "c"))
            started.append(t)
            t.start()
            t.join(timeout=1.0)  # the Prolog runs to its end unless reconcile holds the GPU
        return found

    monkeypatch.setattr(hooks, "jobs_on_gpu", check_then_a_prolog_starts)
    reconcile(be, tmp_path / "j", tmp_path / "c")
    started[0].join(timeout=10)
    assert be.power_limit_w(0) == 420.0
    assert (tmp_path / "c" / f"{uuid}.json").exists()  # for the job's Epilog


def test_a_job_of_two_gpu_types_is_capped_on_every_gpu_slurm_allocated(tmp_path: Path) -> None:
    """slurmd's Prolog environment names only the last GPU type's GPUs (25.11, recorded:
    SLURM_JOB_GPUS=2 for ``--gres=gpu:ta:1,gpu:tb:1`` given ``gpu:ta:1(IDX:0),gpu:tb:1(IDX:2)``):
    the Prolog asks Slurm for the allocation, so the ta GPU is capped too, and the Epilog
    restores both."""
    be = FileStateBackend.create(tmp_path / "g.json", 4, default_w=700, min_w=300)
    gpu_map = {str(i): g.uuid for i, g in enumerate(be.gpus())}
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2", "SLURMD_NODENAME": "gpu07"}
    asked: list[str] = []

    def allocated(job_id: str) -> list[str] | None:
        asked.append(job_id)
        return ["0", "2"]

    plan = prolog(env, be, lambda _j: MEM, gpu_map, tmp_path / "jobs", tmp_path / "caps", job_gpus=allocated)
    assert asked == ["42"]
    assert sorted((p["gpu_index"], p["action"]) for p in plan) == [(0, "capped"), (2, "capped")]
    assert [be.power_limit_w(i) for i in range(4)] == [420.0, 700.0, 420.0, 700.0]
    assert (tmp_path / "jobs" / be.gpus()[0].uuid / "42.json").exists()
    epilog(env, be, tmp_path / "jobs", tmp_path / "caps", gpu_map)
    assert [be.power_limit_w(i) for i in range(4)] == [700.0] * 4
    assert not list((tmp_path / "jobs").rglob("*.json"))


def test_the_allocation_is_asked_only_for_a_cap_and_a_failed_answer_keeps_the_environments_gpus(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 4, default_w=700, min_w=300)
    gpu_map = {str(i): g.uuid for i, g in enumerate(be.gpus())}
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2"}
    nocap = "wattclass:label=compute;conf=0.93;src=rule;mode=enforce"

    def never(_job_id: str) -> list[str] | None:
        raise AssertionError("asked Slurm for a job without a cap")

    prolog(env, be, lambda _j: nocap, gpu_map, tmp_path / "jobs", tmp_path / "caps", job_gpus=never)
    prolog(env, be, lambda _j: None, gpu_map, tmp_path / "jobs", tmp_path / "caps", job_gpus=never)

    def down(_job_id: str) -> list[str] | None:
        raise SlurmError("squeue --json: no answer within 5 s")

    with caplog.at_level(logging.ERROR, logger="wattclass"):
        prolog(env, be, lambda _j: MEM, gpu_map, tmp_path / "jobs", tmp_path / "caps", job_gpus=down)
    assert [be.power_limit_w(i) for i in range(4)] == [700.0, 700.0, 420.0, 700.0]
    assert "cannot ask Slurm for the job's GPUs" in caplog.text


@pytest.mark.parametrize(("cap", "want_w"),
                         [("60%", 420.0), ("80%", 500.0), ("100%", 500.0), ("650W", 500.0)])
def test_a_cap_never_raises_a_gpu_above_the_limit_it_had(tmp_path: Path, cap: str, want_w: float) -> None:
    """An administrator set the GPU to 500 W (default 700 W): a cap is a ceiling, so 80% of the
    default (560 W), 100% or 650 W leave it at 500 W instead of raising it for the job's length;
    the Epilog puts back 500 W."""
    be = FileStateBackend.create(tmp_path / "g.json", 1, default_w=700, min_w=300)
    be.set_power_limit_w(0, 500.0)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0"}
    comment = MEM.replace("cap=60%", f"cap={cap}")
    prolog(env, be, lambda _j: comment, {"0": be.gpus()[0].uuid}, tmp_path / "jobs", tmp_path / "caps")
    assert be.power_limit_w(0) == want_w
    epilog(env, be, tmp_path / "jobs", tmp_path / "caps")
    assert be.power_limit_w(0) == 500.0


@pytest.mark.parametrize("damage", ["corrupt_record", "untrusted_state"])
def test_epilog_of_a_two_type_job_sends_every_gpu_it_held_to_default_when_records_fail(
        tmp_path: Path, damage: str) -> None:
    """The Epilog's SLURM_JOB_GPUS names only the last GPU type too: where a record cannot be
    believed, the job's GPUs are also those its job files name, so the ta GPU is not left at the
    job's cap for reconcile."""
    be = FileStateBackend.create(tmp_path / "g.json", 4, default_w=700, min_w=300)
    gpu_map = {str(i): g.uuid for i, g in enumerate(be.gpus())}
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2"}
    caps = tmp_path / "caps"
    prolog(env, be, lambda _j: MEM, gpu_map, tmp_path / "jobs", caps, job_gpus=lambda _j: ["0", "2"])
    assert [be.power_limit_w(i) for i in range(4)] == [420.0, 700.0, 420.0, 700.0]
    if damage == "corrupt_record":
        (caps / f"{be.gpus()[0].uuid}.json").write_text("{not json")
    else:
        caps.chmod(0o777)
    epilog(env, be, tmp_path / "jobs", caps, gpu_map)
    assert [be.power_limit_w(i) for i in range(4)] == [700.0] * 4


@pytest.mark.parametrize("bad", ["owned by a user", "writable by others", "folder owned by a user",
                                 "symlink owned by a user"])
def test_the_prolog_never_runs_a_squeue_a_user_could_have_replaced(tmp_path: Path, bad: str) -> None:
    """The Prolog runs ``<--slurm-bin>/squeue`` as root on every job start: a squeue (or its
    folder, or a link to it) that a non-root user owns or others can write is that user's code
    running as root. It is refused (the job runs uncapped, logged), never run."""
    fs = tmp_path / "gpus.json"
    FileStateBackend.create(fs, 1)
    bin_dir, marker = tmp_path / "slurm" / "bin", tmp_path / "ran-as-root"
    bin_dir.mkdir(parents=True)
    real = tmp_path / "slurm" / "squeue.real" if bad == "symlink owned by a user" else bin_dir / "squeue"
    real.write_text(f"#!/bin/sh\ntouch {marker}\necho '          11          11 {MEM}'\n")
    real.chmod(0o755)
    if bad == "owned by a user":
        os.chown(real, 65534, 65534)
    elif bad == "writable by others":
        real.chmod(0o757)
    elif bad == "folder owned by a user":
        os.chown(bin_dir, 65534, 65534)
    else:  # a user's link to a root-owned program: they can re-point it at their own
        (bin_dir / "squeue").symlink_to(real)
        os.lchown(bin_dir / "squeue", 65534, 65534)
    gmap = tmp_path / "map.json"
    gmap.write_text(json.dumps({"0": FileStateBackend(fs).gpus()[0].uuid}))
    env = dict(os.environ, SLURM_JOB_ID="11", SLURM_JOB_GPUS="0")
    proc = subprocess.run([sys.executable, "-m", "wattclass.plugin.prolog", "prolog", "--backend",
                           f"filestate:{fs}", "--gpu-map", str(gmap), "--jobs-dir", str(tmp_path / "jobs"),
                           "--state-dir", str(tmp_path / "caps"), "--log", str(tmp_path / "p.log"),
                           "--slurm-bin", str(bin_dir)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "root ran a program a user could have replaced"
    assert "refusing" in (tmp_path / "p.log").read_text()
