"""Parity: the real job_submit.lua (run by lua5.1) and plugin/decide.py agree on every case.

Also checks the Lua side's fail-open loading (unsafe, corrupt, missing tables, symlinks, folders
owned by other users), the GPU-request parsing of every Slurm spelling, and log clipping, without
Slurm.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from wattclass.errors import DataError
from wattclass.labeltable import TableEntry, lua_value, read_label_table, write_label_table
from wattclass.plugin.decide import decide, requests_gpu
from wattclass.plugin.install import render_job_submit
from wattclass.policy import parse_policy

LUA = shutil.which("lua5.1")
pytestmark = pytest.mark.skipif(LUA is None and os.environ.get("CI") != "true", reason="lua5.1 missing")

NAMES = ["train.sh", 'a"b', "x\ny", "100%", "%d%s", "a.b*c+d?[e]^$(f)", "]]==]", "", "é ü", "stream"]

#: The ``slurm`` table slurmctld gives job_submit.lua, as the Lua drivers below need it: one that
#: records every log line in ``slurm.LOG``, one that drops them.
SLURM_RECORDING = r"""slurm = { SUCCESS = 0, ERROR = -1, LOG = {},
  log_info = function(fmt, ...) slurm.LOG[#slurm.LOG + 1] = string.format(fmt, ...) end,
  log_verbose = function(fmt, ...) slurm.LOG[#slurm.LOG + 1] = string.format(fmt, ...) end,
  log_error = function(fmt, ...) slurm.LOG[#slurm.LOG + 1] = "ERR " .. string.format(fmt, ...) end }
"""
SLURM_SILENT = r"""slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_verbose = function() end,
          log_error = function() end }
"""

DRIVER = SLURM_RECORDING + r"""
dofile(SCRIPT)
local function hex(s)
  if s == nil then return "-" end
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end)) .. "."
end
local PARTS = {}
for _, p in ipairs({ "main", "debug" }) do
  PARTS[p] = { flag_default = (p == DEFAULT_PART) and 1 or 0 }
end
for i, c in ipairs(CASES) do
  local jd = { user_name = c.user, name = c.name, account = c.account, partition = c.partition,
               features = c.features, admin_comment = nil, tres_per_node = c.gpus }
  local t = wattclass_load_table()
  local status, reason = "none", "no_table"
  if t ~= nil then
    local ok, s, r = pcall(wattclass_decide, t, c.user, c.name, c.account, c.partition or DEFAULT_PART,
                           c.features, wattclass_requests_gpu({ c.gpus }))
    if ok then status, reason = s, r else status, reason = "error", "lua_error" end
  end
  slurm_job_submit(jd, PARTS, 0)
  local added = nil
  if jd.features ~= c.features then added = jd.features end
  print(i .. " " .. status .. " " .. reason .. " " .. hex(jd.admin_comment) .. " " .. hex(added))
end
for _, l in ipairs(slurm.LOG) do io.stderr:write(l, "\n") end
"""


def _table(tmp: Path, mode: str) -> Path:
    pol = parse_policy({
        "mode": mode, "min_confidence": 0.8,
        "caps": {"compute": "100%", "memory": "60%", "mixed": "450W", "idle": "200W"},
        "placement": {"memory": {"features": ["hbm", "nonexistent"]}, "idle": {"features": ["slow"]}},
        "exempt": {"accounts": ["benchmark"], "partitions": ["debug"], "users": ["carol"]},
    })
    entries = [TableEntry("user_name", "alice", n, None, lab, conf, 5, src)
               for n, lab, conf, src in zip(NAMES, itertools.cycle(["memory", "compute", "idle", "mixed"]),
                                            itertools.cycle([0.93, 0.5, 0.8, 0.99, 0.79999]),
                                            itertools.cycle(["rule", "model:v3", "we;ird=src"]),
                                            strict=False)]
    entries += [TableEntry("user", "alice", None, None, "compute", 0.95, 30, "rule"),  # low names fall here
                TableEntry("user", "dave", None, None, "idle", 0.3, 1, "rule"),  # too low: on to account
                TableEntry("user", "bob", None, None, "memory", 0.9, 3, "rule"),
                TableEntry("user", "carol", None, None, "memory", 0.9, 3, "rule"),
                TableEntry("account", None, None, "physics", "mixed", 0.85, 9, "rule"),
                TableEntry("account", None, None, "benchmark", "memory", 0.95, 9, "rule")]
    path = tmp / f"labels-{mode}.tsv"
    write_label_table(path, entries, pol.table_dict({"hbm", "slow"}))
    return path


def _cases() -> list[dict[str, Any]]:
    users = ["alice", "bob", "carol", "dave", None]
    accounts = [None, "physics", "benchmark"]
    parts = [None, "main", "debug", "main,debug"]
    feats = [None, "", "nvme"]
    gpus = ["gres:gpu:2", "gres/gpu:h200:1", None]
    out = []
    for u, n, a, p, f, g in itertools.product(users, [*NAMES[:6], None], accounts, parts, feats, gpus):
        out.append({"user": u, "name": n, "account": a, "partition": p, "features": f, "gpus": g})
    return out


def _run_lua(script: str, cases: list[dict[str, Any]], tmp: Path, default_part: str = "main",
             driver: str = DRIVER) -> list[tuple[str, ...]]:
    drv = tmp / "driver.lua"
    cases_lua = lua_value([{k: v for k, v in c.items() if v is not None} for c in cases])
    drv.write_text(f"SCRIPT = {lua_value(str(tmp / 'job_submit.lua'))}\nCASES = {cases_lua}\n"
                   f"DEFAULT_PART = {lua_value(default_part)}\n" + driver)
    (tmp / "job_submit.lua").write_text(script)
    proc = subprocess.run([LUA or "lua5.1", str(drv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [tuple(line.split(" ")) for line in proc.stdout.splitlines()]


def lua_table_eval(table: Path, expr: str, tmp: Path) -> str:
    """Evaluate ``expr`` on ``t``, the table as job_submit.lua's own loader reads it (for other tests)."""
    drv = tmp / "eval.lua"
    script = tmp / "job_submit_eval.lua"
    script.write_text(render_job_submit(table))
    drv.write_text(SLURM_SILENT + f"dofile({lua_value(str(script))})\n"
                   f"local t, err = wattclass_read_table({lua_value(str(table))})\n"
                   "if t == nil then error(err) end\n"
                   # records stay text until a job hits them: parse them all for inspection
                   "for _, m in pairs({ t.by_user, t.by_account }) do\n"
                   "  for k, v in pairs(m) do m[k] = wattclass_record(v) end end\n"
                   "for _, names in pairs(t.by_user_name) do\n"
                   "  for k, v in pairs(names) do names[k] = wattclass_record(v) end end\n"
                   f"print({expr})\n")
    proc = subprocess.run([LUA or "lua5.1", str(drv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _unhex(s: str) -> str | None:
    return None if s == "-" else bytes.fromhex(s.rstrip(".")).decode("utf-8")


@pytest.mark.parametrize(("mode", "default_part"), [("enforce", "main"), ("shadow", "main"),
                                                     ("enforce", "debug")])
def test_lua_and_python_decide_identically(tmp_path: Path, mode: str, default_part: str) -> None:
    table_path = _table(tmp_path, mode)
    cases = _cases()
    rows = _run_lua(render_job_submit(table_path), cases, tmp_path, default_part)
    assert len(rows) == len(cases)
    table = read_label_table(table_path)
    statuses = set()
    for (i, status, reason, comment, feats), case in zip(rows, cases, strict=True):
        py = decide(table, case["user"], case["name"], case["account"], case["partition"] or default_part,
                    case["features"], requests_gpu([case["gpus"]]))
        got = (status, reason, _unhex(comment), _unhex(feats))
        assert got == (py.status, py.reason, py.admin_comment, py.features), (i, case)
        statuses.add(reason)
    # the case grid reaches every branch
    assert statuses >= {"exempt_user", "exempt_account", "exempt_partition", "unknown_job",
                        "low_confidence", "no_gpu_request", mode}


def test_enforce_memory_job_gets_comment_and_only_existing_features(tmp_path: Path) -> None:
    table = read_label_table(_table(tmp_path, "enforce"))
    d = decide(table, "alice", "train.sh", None, None, None)
    assert d.admin_comment == "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"
    assert d.features == "hbm"  # "nonexistent" is not on any node
    assert decide(table, "alice", "train.sh", None, None, "nvme").features is None


@pytest.mark.parametrize("damage", ["world_writable", "group_writable", "corrupt", "missing", "bad_shape"])
def test_lua_fails_open_on_bad_tables(tmp_path: Path, damage: str) -> None:
    path = _table(tmp_path, "enforce")
    if damage == "world_writable":
        path.chmod(0o646)
    elif damage == "group_writable":
        path.chmod(0o664)
    elif damage == "corrupt":
        path.write_text(path.read_text().replace("\tmemory\t", "\tmemory\t\t", 1))
    elif damage == "missing":
        path.unlink()
    elif damage == "bad_shape":  # old (version 1) Lua-code table: refused, never run
        path.write_text("return { version = 1, policy = { exempt = 5 }, by_user = {} }")
    rows = _run_lua(render_job_submit(path), [{"user": "alice", "name": "train.sh"}], tmp_path)
    assert rows[0][3:] == ("-", "-")  # admin_comment and features untouched
    assert rows[0][1] in ("none", "error")



# -- item 7: a decision only for jobs that ask for a GPU, in every spelling Slurm uses -------------
GPU_SPECS = {
    "gres:gpu:2": True,  # 22.05 tres_per_node / --gpus (tres_per_job)
    "gres/gpu:2": True,  # 25.11
    "gres/gpu:h200:2": True,  # typed, 25.11
    "gres:gpu:h200:2": True,  # typed, 22.05
    "gres/gpu": True,  # no count: one
    "gres/gpu:h200": True,  # a type, no count: one
    "gpu:1": True,  # the old gres field
    "gres/gpu=1": True,  # TRES "=" form
    "cpu=4,gres/gpu:1": True,  # --gpus-per-task next to cpus in tres_per_task
    "gres/shard:2,gres/gpu:1": True,
    "gres:gpu:0": False,  # --gres=gpu:0
    "gres/gpu:h200:0": False,
    "gres/shard:2": True,  # a share of a GPU is a GPU job (issue 16: the Prolog caps the GPU)
    "gres/shard:0": False,
    "gres/gpuX:2": False,  # another gres whose name starts with gpu
    "gres:mps:100": True,
    "license/foo:1": False,
    "": False,
}

GPU_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
for i, c in ipairs(CASES) do
  print(i .. " " .. tostring(wattclass_requests_gpu({ c.spec })))
end
"""


def test_gpu_request_parsing_agrees_in_lua_and_python(tmp_path: Path) -> None:
    specs = list(GPU_SPECS)
    rows = _run_lua(render_job_submit(tmp_path / "none.tsv"), [{"spec": s} for s in specs], tmp_path,
                    driver=GPU_DRIVER)
    for (_i, lua_says), spec in zip(rows, specs, strict=True):
        assert requests_gpu([spec]) is GPU_SPECS[spec], spec
        assert lua_says == str(GPU_SPECS[spec]).lower(), spec
    # several fields: any one asking for a GPU counts (tres_per_job from --gpus, per-socket, ...)
    assert requests_gpu([None, "", "gres/gpu:1"]) and requests_gpu([None, "gres/shard:1"])
    assert not requests_gpu([None, "gres/nic:1"])


# -- items 5, 6, 8 on the Python side, spelled out ---------------------------------------------------
def test_the_account_key_cannot_be_dodged_by_its_case(tmp_path: Path) -> None:
    """Slurm matches ``-A`` to associations ignoring case and lower-cases the account only after
    job_submit (validate_job_create_req): ``sbatch -A PHYSICS`` runs in account physics but was
    looked up as "PHYSICS", missed the physics key and ran uncapped."""
    table_path = _table(tmp_path, "enforce")
    cases = [{"user": "dave", "name": "x", "account": a, "partition": "main", "gpus": "gres/gpu:1"}
             for a in ("physics", "PHYSICS", "Physics", "BENCHMARK")]
    rows = _run_lua(render_job_submit(table_path), cases, tmp_path)
    assert [r[1:3] for r in rows] == [("enforce", "enforce")] * 3 + [("none", "exempt_account")]
    assert len({r[3] for r in rows[:3]}) == 1  # the same admin_comment: physics's mixed cap
    table = read_label_table(table_path)
    assert [decide(table, "dave", "x", c["account"], "main").reason for c in cases] == [
        "enforce", "enforce", "enforce", "exempt_account"]
    # the policy names accounts as the sysadmin typed them, a --jobs-file as the site wrote them;
    # Slurm's are lower-case, and so are the table's keys and exemptions
    assert parse_policy({"exempt": {"accounts": ["Benchmark"]}}).exempt_accounts == {"benchmark"}
    mixed = tmp_path / "mixed.tsv"
    write_label_table(mixed, [TableEntry("account", None, None, "Chem", "memory", 0.9, 3, "rule")],
                      {**parse_policy({"caps": {"memory": "60%"}}).table_dict(set()),
                       "exempt": {"accounts": {"BIO": True}}})
    rows = _run_lua(render_job_submit(mixed),
                    [{**cases[0], "account": "chem"}, {**cases[0], "account": "bio"}], tmp_path)
    assert [r[1:3] for r in rows] == [("shadow", "shadow"), ("none", "exempt_account")], rows


def test_exempt_only_when_every_partition_is_and_low_keys_fall_through(tmp_path: Path) -> None:
    table = read_label_table(_table(tmp_path, "enforce"))
    assert decide(table, "bob", "x", None, "debug").reason == "exempt_partition"
    assert decide(table, "bob", "x", None, "main,debug").reason == "enforce"  # may run in main
    assert decide(table, "bob", "x", None, "debug,debug").reason == "exempt_partition"
    # alice's "stream" entry (conf 0.5 at index 9? see NAMES cycle) is below 0.8: the user key decides
    low = next(n for n, c in zip(NAMES, itertools.cycle([0.93, 0.5, 0.8, 0.99, 0.79999])) if c < 0.8)
    d = decide(table, "alice", low, None, "main")
    assert (d.reason, d.key, d.label) == ("enforce", "user", "compute")
    # dave's user key is too weak too: on to the account key
    d = decide(table, "dave", "x", "physics", "main")
    assert (d.key, d.label) == ("account", "mixed")
    assert decide(table, "dave", "x", None, "main").reason == "low_confidence"
    assert decide(table, "bob", "x", None, "main", gpu_request=False).reason == "no_gpu_request"


# -- the submission path reads only the job fields a decision can use ------------------------------
READS_DRIVER = r"""
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_verbose = function() end,
          log_error = function(fmt, ...) print("ERR " .. string.format(fmt, ...)) end }
dofile(SCRIPT)
-- job_desc as slurmctld gives it: every read is a C call, so count them (slurmctld's cost)
for i, c in ipairs(CASES) do
  local reads, fields = {}, { user_name = c.user, name = c.name, account = c.account,
                              default_account = c.default_account, tres_per_node = c.gpus }
  local jd = setmetatable({}, {
    __index = function(_, k) reads[#reads + 1] = k; return fields[k] end,
    __newindex = function(_, k, v) fields[k] = v end })
  local parts = { main = setmetatable({}, { __index = function(_, k)
    reads[#reads + 1] = "part." .. k; if k == "flag_default" then return 1 end end }) }
  slurm_job_submit(jd, parts, 0)
  table.sort(reads)
  print(i .. " " .. tostring(fields.admin_comment) .. " " .. table.concat(reads, ","))
end
"""


def _reads(table: Path, cases: list[dict[str, Any]], tmp: Path) -> list[tuple[str, str, set[str]]]:
    rows = _run_lua(render_job_submit(table), cases, tmp, driver=READS_DRIVER)
    return [(r[1], r[2] if len(r) > 2 else "", set(r[2].split(",")) if len(r) > 2 else set()) for r in rows]


def test_submission_reads_only_the_job_fields_the_table_can_use(tmp_path: Path) -> None:
    """Each job_desc field is a C call inside slurmctld's submission RPC (about 5 us each, with a
    default account an accounting lookup besides); the hook cost sbatch 3% of its throughput.
    A job without a GPU request reads the GPU fields and whether it gets its nodes' GPUs anyway
    (``WHOLE_NODE_FIELDS``), and nothing of the decision; a table with no
    account key and no account or partition exemption never reads account, default_account,
    partition or the partition list. A table that can use them still does (the parity test above
    covers those decisions)."""
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"}})
    plain = tmp_path / "plain.tsv"
    write_label_table(plain, [TableEntry("user_name", "alice", "train", None, "memory", 0.9, 3, "rule")],
                      pol.table_dict(set()))
    cases = [{"user": "alice", "name": "train", "gpus": "gres:gpu:1"},
             {"user": "alice", "name": "train", "gpus": None},
             {"user": "alice", "name": "other", "gpus": "gres/gpu:2", "default_account": "physics"}]
    rows = _reads(plain, cases, tmp_path)
    assert rows[0][0].startswith("wattclass:label=memory;"), rows[0]
    for _comment, _, reads in (rows[0], rows[2]):
        assert not reads & {"account", "default_account", "partition", "part.flag_default"}, reads
    # a job without a GPU request reads only what says whether it gets GPUs anyway (a whole-node
    # job: --exclusive, an OverSubscribe=EXCLUSIVE partition; --ntasks-per-gpu)
    assert rows[1][0] == "nil" and reads_beyond_gpu(rows[1][2]) <= WHOLE_NODE_FIELDS, rows[1]
    assert rows[2][0] == "nil", rows[2]

    with_acct = tmp_path / "acct.tsv"
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"},
                        "exempt": {"partitions": ["main"]}})
    write_label_table(with_acct, [TableEntry("account", None, None, "physics", "memory", 0.9, 3, "rule")],
                      pol.table_dict(set()))
    rows = _reads(with_acct, [cases[2]], tmp_path)
    # exempt: main, the default partition, read because the table exempts a partition
    assert rows[0][0] == "nil" and {"default_account", "part.flag_default"} <= rows[0][2], rows
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"}})
    write_label_table(with_acct, [TableEntry("account", None, None, "physics", "memory", 0.9, 3, "rule")],
                      pol.table_dict(set()))
    rows = _reads(with_acct, [cases[2]], tmp_path)
    assert rows[0][0].startswith("wattclass:label=memory;") and "default_account" in rows[0][2], rows


#: What job_submit.lua reads of a job without a GPU field: whether it gets GPUs anyway, as a
#: whole-node job (--exclusive, an OverSubscribe=EXCLUSIVE partition) or by --ntasks-per-gpu.
WHOLE_NODE_FIELDS = {"shared", "partition", "part.flag_default", "part.max_share", "ntasks_per_tres",
                     "reservation", "part.state_up", "part.alternate"}


def reads_beyond_gpu(reads: set[str]) -> set[str]:
    """Fields read by a job without a GPU request beyond the GPU fields, its name and its user."""
    from wattclass.plugin.decide import GPU_FIELDS

    return reads - set(GPU_FIELDS) - {"name", "user_name"}


# -- item 13: the table is data, parsed with plain string functions, with a byte limit --------------
LOAD_DRIVER = SLURM_RECORDING + r"""
dofile(SCRIPT)
local t, err = wattclass_load_table()
if t == nil then print("nil " .. tostring(err)) else
  local n = 0
  for _, names in pairs(t.by_user_name) do for _ in pairs(names) do n = n + 1 end end
  print("ok " .. n)
end
for _, l in ipairs(slurm.LOG) do print("LOG " .. l) end
"""


def _load_in_lua(script: str, tmp: Path) -> list[str]:
    rows = _run_lua(script, [], tmp, driver=LOAD_DRIVER)
    return [" ".join(r) for r in rows]


@pytest.mark.parametrize("code", ["while true do end", "return { version = 1, policy = {} }",
                                  "os.exit(3)"])
def test_lua_code_in_the_table_is_never_run(tmp_path: Path, code: str) -> None:
    path = tmp_path / "labels.tsv"
    path.write_text(code + "\n")
    path.chmod(0o644)
    out = _load_in_lua(render_job_submit(path), tmp_path)  # returns: nothing hung or exited
    assert out[0].startswith("nil label table is not a version 2 wattclass table"), out


def test_lua_reads_at_most_max_bytes_and_logs(tmp_path: Path) -> None:
    path = tmp_path / "labels.tsv"
    entries = [TableEntry("user_name", "u", f"job-{i:05d}", None, "memory", 0.9, 1, "rule")
               for i in range(2000)]
    write_label_table(path, entries, {"mode": "enforce", "min_confidence": 0.8})
    size = path.stat().st_size
    script = render_job_submit(path).replace("local MAX_BYTES = 16 * 1024 * 1024",
                                             f"local MAX_BYTES = {size // 2}")
    out = _load_in_lua(script, tmp_path)
    kept = int(out[0].split()[1])
    assert 900 < kept < 1000, out[0]  # about half the entries, no partial last line
    assert any("larger than" in line and "only the first" in line for line in out[1:]), out
    assert _load_in_lua(render_job_submit(path), tmp_path)[0] == "ok 2000"


def test_one_user_cannot_push_other_users_out_of_the_table(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A user controls job names, which become keys. 200 confident jobs named with 100 KB each used
    to fill the table past MAX_BYTES ahead of everyone less confident, and job_submit.lua, which
    reads only MAX_BYTES, then lost the others' keys: their jobs went uncapped. Now a name longer
    than MAX_NAME_BYTES gets no key (the job falls through to its user key), one user keeps at most
    MAX_NAMES_PER_USER names, and the writer never writes more than the reader reads."""
    from wattclass import labeltable

    flood = [TableEntry("user_name", "mallory", f"{i:04d}" + "%" * 100_000, None, "compute", 0.86, 3, "rule")
             for i in range(200)]
    many = [TableEntry("user_name", "mallory", f"n{i}", None, "compute", 0.9, 3, "rule")
            for i in range(labeltable.MAX_NAMES_PER_USER + 50)]
    alice = [TableEntry("user", "alice", None, None, "memory", 0.81, 9, "rule"),
             TableEntry("user_name", "alice", "train.sh", None, "memory", 0.82, 9, "rule")]
    path = tmp_path / "labels.tsv"
    with caplog.at_level("WARNING"):
        dropped = write_label_table(path, flood + many + alice, {"mode": "enforce", "min_confidence": 0.8})
    assert path.stat().st_size <= labeltable.MAX_BYTES
    assert dropped == 200 + 50
    assert lua_table_eval(path, "t.by_user.alice.label .. ' ' .. t.by_user_name.alice['train.sh'].label",
                          tmp_path) == "memory memory"
    names = read_label_table(path)["by_user_name"]["mallory"]
    assert len(names) == labeltable.MAX_NAMES_PER_USER and all(len(n) < 10 for n in names)
    assert "longer than" in caplog.text and "per user" in caplog.text


def test_writer_keeps_the_most_confident_entries_past_the_limit(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    entries = [TableEntry("user", f"u{i}", None, None, "memory", i / 10, 1, "rule") for i in range(10)]
    path = tmp_path / "labels.tsv"
    with caplog.at_level("WARNING"):
        dropped = write_label_table(path, entries, None, max_entries=4)
    assert dropped == 6 and "6 entries over the limit of 4 dropped" in caplog.text
    assert sorted(read_label_table(path)["by_user"]) == ["u6", "u7", "u8", "u9"]


# -- item 11: symlinks and folders owned by others -----------------------------------------------------
@pytest.mark.parametrize("damage", ["symlink_file", "symlink_folder", "folder_owned_by_nobody",
                                    "folder_group_writable"])
def test_lua_refuses_untrusted_paths(tmp_path: Path, damage: str) -> None:
    real = _table(tmp_path, "enforce")
    folder = tmp_path / "etc"
    folder.mkdir()
    path = folder / "labels.tsv"
    if damage == "symlink_file":
        path.symlink_to(real)
        want = "is a symlink"
    elif damage == "symlink_folder":
        os.rename(folder, tmp_path / "real-etc")
        folder.symlink_to(tmp_path / "real-etc")
        shutil.copy(real, tmp_path / "real-etc" / "labels.tsv")
        want = "is a symlink"
    elif damage == "folder_owned_by_nobody":
        shutil.copy(real, path)
        os.chown(folder, 65534, 65534)
        want = "is not owned by root"
    else:
        shutil.copy(real, path)
        folder.chmod(0o775)
        want = "writable by group or others"
    out = _load_in_lua(render_job_submit(path), tmp_path)
    assert out[0].startswith("nil refusing label table") and want in out[0], out
    rows = _run_lua(render_job_submit(path), [{"user": "alice", "name": "train.sh", "gpus": "gres/gpu:1"}],
                    tmp_path)
    assert rows[0][3:] == ("-", "-")


# -- item 14: user strings in log lines are clipped ----------------------------------------------------
def test_huge_job_name_gives_a_short_log_line(tmp_path: Path) -> None:
    path = _table(tmp_path, "enforce")
    case = {"user": "alice", "name": "%" * 100_000, "gpus": "gres/gpu:1"}
    drv = tmp_path / "driver.lua"
    drv.write_text(f"SCRIPT = {lua_value(str(tmp_path / 'job_submit.lua'))}\nCASES = {lua_value([case])}\n"
                   'DEFAULT_PART = "main"\n' + DRIVER)
    (tmp_path / "job_submit.lua").write_text(render_job_submit(path))
    proc = subprocess.run([LUA or "lua5.1", str(drv)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 0 < len(proc.stderr) < 1000, len(proc.stderr)
    assert b"(100000 bytes)" in proc.stderr and b"\n" not in proc.stderr.rstrip(b"\n")


# -- issue 12: the canary arm -------------------------------------------------------------------------
CANARY_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
local t = wattclass_load_table()
for i, c in ipairs(CASES) do
  local s, r, comment = wattclass_decide(t, c.user, c.name, nil, nil, nil, true, c.now)
  print(i .. " " .. s .. " " .. (comment or "-"))
end
"""


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_canary_arm_is_identical_in_lua_and_python_and_has_the_policy_fraction(tmp_path: Path,
                                                                              mode: str) -> None:
    pol = parse_policy({"mode": mode, "caps": {"memory": "60%"}, "canary": {"fraction": 0.2}})
    entries = [TableEntry("user", f"user{i}", None, None, "memory", 0.95, 3, "rule") for i in range(50)]
    path = tmp_path / "labels.tsv"
    write_label_table(path, entries, pol.table_dict())
    path.chmod(0o644)
    # 50 users x 12 days: 600 user-days, each its own draw of the arm
    cases = [{"user": f"user{i % 50}", "name": NAMES[i % len(NAMES)],
              "now": 1_764_000_000 + 86400 * (i // 50) + 37 * i} for i in range(600)]
    drv = tmp_path / "driver.lua"
    (tmp_path / "job_submit.lua").write_text(render_job_submit(path))
    drv.write_text(f"SCRIPT = {lua_value(str(tmp_path / 'job_submit.lua'))}\nCASES = {lua_value(cases)}\n"
                   + CANARY_DRIVER)
    proc = subprocess.run([LUA or "lua5.1", str(drv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    table = read_label_table(path)
    arms = []
    for line, c in zip(proc.stdout.splitlines(), cases, strict=True):
        _, status, comment = line.split(" ", 2)
        py = decide(table, c["user"], c["name"], submit_s=c["now"])
        assert (status, comment) == (py.status, py.admin_comment), c
        arms.append(comment.rsplit("arm=", 1)[1])
    canary = arms.count("capped" if mode == "shadow" else "control") / len(arms)
    assert 0.14 < canary < 0.26  # the policy's 0.2, up to sampling noise of 600 jobs
    assert decide(table, "user1", "x", submit_s=5) == decide(table, "user1", "x", submit_s=5)


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_a_user_cannot_reroll_the_canary_arm(tmp_path: Path, mode: str) -> None:
    """Renaming or resubmitting within a day never changes the arm (enforce: control is uncapped)."""
    pol = parse_policy({"mode": mode, "caps": {"memory": "60%"}, "canary": {"fraction": 0.5}})
    path = tmp_path / "labels.tsv"
    write_label_table(path, [TableEntry("user", "mallory", None, None, "memory", 0.95, 3, "rule")],
                      pol.table_dict())
    path.chmod(0o644)
    day0 = 1_764_028_800  # a UTC midnight
    cases = [{"user": "mallory", "name": f"try{i}.sh", "now": day0 + 97 * i} for i in range(300)]
    cases += [{"user": "mallory", "name": "x", "now": day0 + 86400 * d} for d in range(1, 40)]
    drv = tmp_path / "driver.lua"
    (tmp_path / "job_submit.lua").write_text(render_job_submit(path))
    drv.write_text(f"SCRIPT = {lua_value(str(tmp_path / 'job_submit.lua'))}\nCASES = {lua_value(cases)}\n"
                   + CANARY_DRIVER)
    proc = subprocess.run([LUA or "lua5.1", str(drv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lua_arms = [line.rsplit("arm=", 1)[1] for line in proc.stdout.splitlines()]
    table = read_label_table(path)
    py_arms = [str(decide(table, c["user"], c["name"], submit_s=c["now"]).admin_comment).rsplit("arm=", 1)[1]
               for c in cases]
    assert lua_arms == py_arms
    assert len(set(lua_arms[:300])) == 1  # 300 names and seconds within one day: one arm
    assert set(lua_arms[300:]) == {"capped", "control"}  # other days draw again


def test_no_canary_means_no_arm(tmp_path: Path) -> None:
    table = read_label_table(_table(tmp_path, "shadow"))
    d = decide(table, "alice", "train.sh", None, None, None, submit_s=1)
    assert d.admin_comment and "arm=" not in d.admin_comment


# -- issue 13: a confidence threshold per label (the costly direction asks more evidence) -------------
THRESHOLD_STEPS = [0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 1.0]


def _random_policy(rng: random.Random) -> dict[str, Any]:
    labels = ["compute", "memory", "mixed", "idle"]
    caps = {lb: rng.choice(["100%", "60%", "450W", "40%"]) for lb in labels if rng.random() < 0.8}
    return {
        "mode": rng.choice(["enforce", "shadow"]),
        "min_confidence": rng.choice(THRESHOLD_STEPS),
        "min_confidence_by_label": {lb: rng.choice([*THRESHOLD_STEPS, round(rng.random(), 4)])
                                    for lb in labels if rng.random() < 0.6},
        "caps": caps,
        "placement": {"memory": {"features": ["hbm"]}} if rng.random() < 0.5 else {},
        "exempt": {"accounts": ["benchmark"], "partitions": ["debug"]},
    }


def _random_entries(rng: random.Random, users: list[str], names: list[str],
                    accounts: list[str]) -> list[TableEntry]:
    labels = ["compute", "memory", "mixed", "idle"]

    def conf() -> float:  # often exactly on a threshold, to test ">=" on both sides
        return rng.choice([*THRESHOLD_STEPS, round(rng.random(), 4), 0.8999, 0.9001])

    out = [TableEntry("user_name", u, n, None, rng.choice(labels), conf(), 3, "rule")
           for u in users for n in names if rng.random() < 0.5]
    out += [TableEntry("user", u, None, None, rng.choice(labels), conf(), 9, "model:v1")
            for u in users if rng.random() < 0.7]
    out += [TableEntry("account", None, None, a, rng.choice(labels), conf(), 20, "rule")
            for a in accounts if rng.random() < 0.7]
    return out


def test_lua_and_python_agree_with_random_per_label_thresholds(tmp_path: Path) -> None:
    """Random policies (global and per-label thresholds, caps, modes) and random tables whose
    confidences often sit exactly on a threshold: 8 tables x 1,000 random jobs, Lua and Python agree,
    and the per-label thresholds change some of those decisions (so the grid exercises them)."""
    users, names = ["alice", "bob", "dave", "erin"], ["train.sh", "a.b*c", "x%y", ""]
    accounts = ["physics", "chem", "benchmark"]
    per_label_mattered, reasons = 0, set()
    for seed in range(8):
        rng = random.Random(seed)
        pol_doc = _random_policy(rng)
        pol = parse_policy(pol_doc)
        path = tmp_path / "labels.tsv"
        write_label_table(path, _random_entries(rng, users, names, accounts), pol.table_dict({"hbm"}))
        cases = [{"user": rng.choice([*users, None]), "name": rng.choice([*names, "never", None]),
                  "account": rng.choice([*accounts, None]), "partition": rng.choice([None, "main", "debug"]),
                  "features": rng.choice([None, "", "nvme"]), "gpus": rng.choice(["gres/gpu:1", None])}
                 for _ in range(1000)]
        rows = _run_lua(render_job_submit(path), cases, tmp_path)
        table = read_label_table(path)
        assert table["policy"]["min_confidence_by_label"] == pol.min_confidence_by_label
        global_only = {**table, "policy": {**table["policy"], "min_confidence_by_label": {}}}
        for (i, status, reason, comment, feats), case in zip(rows, cases, strict=True):
            args = (case["user"], case["name"], case["account"], case["partition"] or "main",
                    case["features"], requests_gpu([case["gpus"]]))
            py = decide(table, *args)
            got = (status, reason, _unhex(comment), _unhex(feats))
            assert got == (py.status, py.reason, py.admin_comment, py.features), (seed, i, case, pol_doc)
            per_label_mattered += decide(global_only, *args)[:6] != py[:6]
            reasons.add(reason)
    assert per_label_mattered > 100, per_label_mattered
    assert reasons >= {"low_confidence", "no_decision", "unknown_job", "enforce", "shadow", "exempt_account"}


PER_LABEL_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
local t, err = wattclass_load_table()
if t == nil then print("nil " .. tostring(err)) end
for i, c in ipairs(CASES) do
  if t ~= nil then
    local s, r, comment, _, label, conf = wattclass_decide(t, c.user, c.name, c.account, nil, nil, true)
    print(i .. " " .. s .. " " .. r .. " " .. tostring(label) .. " " .. tostring(comment))
  end
end
"""


def test_memory_label_held_to_its_own_threshold_falls_through_in_lua(tmp_path: Path) -> None:
    """memory needs 0.9 here, the rest 0.8: alice's train.sh (memory 0.85) is not acted on and her
    user key (compute 0.82) decides; bob's memory 0.9 key is; with no broader key, low_confidence."""
    entries = [TableEntry("user_name", "alice", "train.sh", None, "memory", 0.85, 5, "rule"),
               TableEntry("user", "alice", None, None, "compute", 0.82, 9, "rule"),
               TableEntry("user_name", "bob", "train.sh", None, "memory", 0.9, 5, "rule"),
               TableEntry("user", "carol", None, None, "memory", 0.89, 5, "rule"),
               TableEntry("user", "erin", None, None, "compute", 0.5, 5, "rule")]
    cases = [{"user": "alice", "name": "train.sh"}, {"user": "bob", "name": "train.sh"},
             {"user": "carol", "name": "x"}, {"user": "erin", "name": "x"}]
    out = {}
    for by_label in ({}, {"memory": 0.9, "compute": 0.5}):
        pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "min_confidence_by_label": by_label,
                            "caps": {"memory": "60%", "compute": "100%"}})
        path = tmp_path / "labels.tsv"
        write_label_table(path, entries, pol.table_dict())
        path.chmod(0o644)
        rows = _run_lua(render_job_submit(path), cases, tmp_path, driver=PER_LABEL_DRIVER)
        table = read_label_table(path)
        for row, c in zip(rows, cases, strict=True):
            py = decide(table, c["user"], c["name"])
            assert row[1:4] == (py.status, py.reason, str(py.label)), (by_label, c)
        out[bool(by_label)] = [(r[2], r[3]) for r in rows]
    assert out[False] == [("enforce", "memory"), ("enforce", "memory"), ("enforce", "memory"),
                          ("low_confidence", "compute")]
    assert out[True] == [("enforce", "compute"), ("enforce", "memory"), ("low_confidence", "memory"),
                         ("enforce", "compute")]  # compute 0.5 reaches its own 0.5


@pytest.mark.parametrize(("line", "why"), [
    ("min_confidence_label\tmemory\t1.5", "bad min_confidence_label"),
    ("min_confidence_label\tmemory\tnan", "bad min_confidence_label"),
    ("min_confidence_label\tmemory\thigh", "bad min_confidence_label"),
    ("min_confidence_label\tmemory\t0x1", "bad min_confidence_label"),  # Lua's tonumber took hex
    ("min_confidence_label\tgpu\t0.9", "unknown record"),
    ("min_confidence_label\tmemory", "unknown record"),
    # a record from a later version: refused (jobs uncapped), never skipped (see labeltable docstring)
    ("min_confidence_partition\tdebug\t0.9", "unknown record"),
])
def test_bad_or_unknown_threshold_line_refuses_the_table(tmp_path: Path, line: str, why: str) -> None:
    path = _table(tmp_path, "enforce")
    text = path.read_text().replace("\nmin_confidence\t0.8\n", f"\nmin_confidence\t0.8\n{line}\n", 1)
    path.write_text(text)
    out = _load_in_lua(render_job_submit(path), tmp_path)
    assert out[0].startswith("nil label table line 5: ") and why in out[0], out
    rows = _run_lua(render_job_submit(path), [{"user": "alice", "name": "train.sh", "gpus": "gres/gpu:1"}],
                    tmp_path)
    assert rows[0][1:] == ("none", "no_table", "-", "-")  # the job stays as submitted
    with pytest.raises(DataError, match="line 5"):
        read_label_table(path)


@pytest.mark.parametrize(("line", "why"), [
    ("min_confidence\t80", "bad min_confidence"),  # a percentage: no key would ever reach it
    ("min_confidence\tnan", "bad min_confidence"),  # Lua's tonumber takes nan: every job uncapped
    ("min_confidence\t-1", "bad min_confidence"),  # every low key acted on
    ("canary_threshold\tnan", "bad canary_threshold"),
    ("canary_threshold\t-5", "bad canary_threshold"),
    ("canary_threshold\t0x10", "bad canary_threshold"),
    ("canary_threshold\t1e3", "bad canary_threshold"),  # Lua's tonumber took these; Python's int() not
    ("canary_threshold\t100.0", "bad canary_threshold"),
    ("canary_threshold\t+5", "bad canary_threshold"),  # both took it: the writer writes digits only
])
def test_an_out_of_range_policy_number_refuses_the_table(tmp_path: Path, line: str, why: str) -> None:
    """The global threshold and the canary size were taken whatever their value (a hand edit, a
    corrupt table), while a per-label threshold outside [0, 1] refused the table: now both
    readers refuse them alike, naming the line, instead of silently deciding nothing."""
    path = _table(tmp_path, "enforce")
    old = "\nmin_confidence\t0.8\n"
    new = f"\n{line}\n" if line.startswith("min_") else f"{old}{line}\n"  # replaces / adds a line
    path.write_text(path.read_text().replace(old, new, 1))
    out = _load_in_lua(render_job_submit(path), tmp_path)
    assert out[0].startswith("nil label table line ") and why in out[0], out
    with pytest.raises(DataError, match="line"):
        read_label_table(path)


# -- whole-node jobs get every GPU of their nodes without asking for one -----------------------------
WHOLE_NODE_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
local PARTS = { main = { flag_default = 1, max_share = 1 }, excl = { flag_default = 0, max_share = 0 },
                drained = { flag_default = 0, max_share = 1, state_up = 2, alternate = "excl" } }
slurm.reservations = { xr = { partition = "excl" } }
for i, c in ipairs(CASES) do
  local jd = { user_name = "bob", name = "x", shared = c.shared or 65534, partition = c.partition,
               tres_per_node = c.gpus, reservation = c.reservation }
  slurm_job_submit(jd, PARTS, 1000)
  local rc = "-"
  if c.modify_to or c.modify_shared then  -- then uid 1000 changes the pending job
    local rec = { job_id = 7, user_name = "bob", name = "x", partition = c.partition or "main",
                  admin_comment = jd.admin_comment, tres_per_node = c.gpus }
    local upd = { partition = c.modify_to, shared = c.modify_shared or 65534 }
    rc = tostring(slurm_job_modify(upd, rec, PARTS, 1000))
    jd.admin_comment = upd.admin_comment or rec.admin_comment
  end
  print(i .. " " .. tostring(jd.admin_comment) .. " " .. tostring(jd.features) .. " " .. rc)
end
"""


def test_a_whole_node_job_is_decided_though_it_asks_for_no_gpu(tmp_path: Path) -> None:
    """Slurm gives an exclusive job every GPU of its nodes even with no GPU request
    (_handle_exclusive_gres, 22.05 to 25.11): ``sbatch --exclusive job.sh`` was left as "no GPU
    request" and ran on all of a node's GPUs uncapped. Such a job is now decided (the cap), without
    placement features (it may be a CPU job)."""
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"},
                        "placement": {"memory": {"features": ["hbm"]}}})
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "bob", None, None, "memory", 0.9, 3, "rule")],
                      pol.table_dict({"hbm"}))
    cases = [{"shared": 0},  # --exclusive
             {},  # a CPU job: unchanged
             {"shared": 2},  # --exclusive=user: not whole-node
             {"partition": "excl"},  # OverSubscribe=EXCLUSIVE
             {"partition": "main,excl"},  # may run there
             {"gpus": "gres/gpu:1"},  # an explicit request: cap and placement, as before
             {"shared": 0, "modify_to": "excl"},  # still decided the same: the change is allowed
             {"gpus": "gres/gpu:1", "modify_to": "excl"},
             # an operator's OverSubscribe=no on a pending CPU job: Slurm's update sets share_res,
             # not whole_node, so the job gets no GPU; it was re-decided as whole-node and the
             # operator's change refused (slurm.ERROR)
             {"modify_shared": 0}]
    rows = _run_lua(render_job_submit(table), cases, tmp_path, driver=WHOLE_NODE_DRIVER)
    capped = [r[1].startswith("wattclass:label=memory;") for r in rows]
    assert capped == [True, False, False, True, True, True, True, True, False], rows
    # placement features: for an explicit GPU request only
    assert [r[2] for r in rows] == ["nil"] * 5 + ["hbm", "nil", "hbm", "nil"], rows
    assert [r[3] for r in rows[-3:]] == ["0", "0", "0"], rows  # slurm.SUCCESS
    d = decide(read_label_table(table), "bob", "x", None, "main", None, gpu_request="whole_node")
    assert (d.status, d.features) == ("enforce", None) and d.admin_comment == rows[0][1]


def test_a_job_that_lands_in_an_exclusive_partition_is_whole_node(tmp_path: Path) -> None:
    """The partition that makes a CPU job whole-node is the one slurmctld puts it in: its
    reservation's (no -p) or a drained partition's Alternate=. Judged by the partition named (or
    the default), such a job ran on every GPU of its nodes with no decision."""
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"}})
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "bob", None, None, "memory", 0.9, 3, "rule")],
                      pol.table_dict(set()))
    cases = [{"reservation": "xr"}, {"partition": "drained"}, {"reservation": "xr", "partition": "main"}]
    rows = _run_lua(render_job_submit(table), cases, tmp_path, driver=WHOLE_NODE_DRIVER)
    assert [r[1].startswith("wattclass:label=memory;") for r in rows] == [True, True, False], rows
    assert [r[2] for r in rows] == ["nil"] * 3, rows  # whole-node: no placement features


def _names(text: str) -> set[str]:
    return set(text.split())


#: The fields Slurm gives job_submit.lua (slurm-25.11.7: job_desc in job_submit_lua.c
#: _get_job_req_field, job_rec in src/lua/slurm_lua.c slurm_lua_job_record_field, a partition in
#: _part_rec_field); any other name reads nil there, whatever a test's plain Lua table holds.
SLURM_JOB_DESC_FIELDS = _names("""
account acctg_freq admin_comment alloc_node argc argv array_inx assoc_comment assoc_qos batch_features
begin_time bitflags boards_per_node burst_buffer clusters comment container contiguous cores_per_socket
cpu_freq_gov cpu_freq_max cpu_freq_min cpus_per_task cpus_per_tres cron_job default_account default_qos
delay_boot dependency end_time environment exc_nodes extra features gres group_id het_job_offset immediate
licenses mail_type mail_user max_cpus max_nodes mcs_label mem_per_tres min_cpus min_mem_per_cpu
min_mem_per_node min_nodes name network nice ntasks_per_board ntasks_per_core ntasks_per_gpu
ntasks_per_node ntasks_per_socket ntasks_per_tres num_tasks oversubscribe pack_job_offset partition
pn_min_cpus pn_min_memory pn_min_tmp_disk prefer priority qos reboot req_context req_nodes req_switch
requeue reservation script segment_size selinux_context shared site_factor sockets_per_board
sockets_per_node spank_job_env spank_job_env_size std_err std_in std_out threads_per_core time_limit
time_min tres_bind tres_freq tres_per_job tres_per_node tres_per_socket tres_per_task user_id user_name
wait4switch wckey work_dir""")
SLURM_JOB_REC_FIELDS = _names("""
account admin_comment alloc_node argv array_job_id array_task_cnt array_task_id batch_features batch_host
best_switch burst_buffer comment container cpus_per_tres curr_dependency delay_boot derived_ec
direct_set_prio end_time exit_code extra features gres gres_req gres_used group_id het_job_id
het_job_id_set het_job_offset job_id job_state licenses max_cpus max_nodes mcs_label mem_per_tres min_cpus
min_mem_per_cpu min_mem_per_node min_nodes name nice nodes orig_dependency origin_cluster pack_job_id
pack_job_id_set pack_job_offset partition pn_min_cpus pn_min_memory priority qos reboot req_switch resizing
restart_cnt resv_name script segment_size selinux_context site_factor spank_job_env spank_job_env_size
start_time std_err std_in std_out submit_time time_limit time_min total_cpus total_nodes tres_alloc_str
tres_bind tres_fmt_alloc_str tres_fmt_req_str tres_freq tres_per_job tres_per_node tres_per_socket
tres_per_task tres_req_str user_id user_name wait4switch wait4switch_start wckey work_dir""")
SLURM_PART_FIELDS = _names("""
allow_accounts allow_alloc_nodes allow_groups allow_qos alternate billing_weights_str def_mem_per_cpu
def_mem_per_node default_time deny_accounts deny_qos flag_default flags max_cpus_per_node
max_cpus_per_socket max_mem_per_cpu max_mem_per_node max_nodes max_nodes_orig max_oversubscribe max_share
max_time min_nodes min_nodes_orig name nodes priority_job_factor priority_tier qos state_up total_cpus
total_nodes""")

ROOT = Path(__file__).resolve().parents[1]


def test_job_submit_lua_reads_only_fields_slurm_gives_it() -> None:
    """job_submit.lua read ``job_desc.core_spec`` to catch ``-S`` jobs, but Slurm gives Lua no such
    field in 22.05 or 25.11 (nil, always): the check never fired, while a unit test's plain table
    had it. Every field the script reads must be one Slurm exposes (the real-Slurm tests cover what
    they hold)."""
    from wattclass.plugin.decide import GPU_FIELDS

    script = (ROOT / "plugin" / "job_submit.lua").read_text()
    reads = {(m[1], m[2]) for m in re.finditer(r"\b(job_desc|job_rec|part)\.([a-z_]+)\b", script)}
    assert ("job_desc", "shared") in reads and ("part", "max_share") in reads, reads
    known = {"job_desc": SLURM_JOB_DESC_FIELDS, "job_rec": SLURM_JOB_REC_FIELDS, "part": SLURM_PART_FIELDS}
    assert {(o, f) for o, f in reads if f not in known[o]} == set()
    # job_desc[k] / job_rec[k] for k in GPU_FIELDS
    assert set(GPU_FIELDS) <= SLURM_JOB_DESC_FIELDS & SLURM_JOB_REC_FIELDS


# -- GPUs that no GPU field names: --ntasks-per-gpu -------------------------------------------------
TASKS_PER_GPU_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
local PARTS = { main = { flag_default = 1, max_share = 1 }, debug = { flag_default = 0, max_share = 1 } }
for i, c in ipairs(CASES) do
  local jd = { user_name = "bob", name = "x", shared = 65534, partition = c.partition,
               ntasks_per_tres = c.ntasks_per_tres or 65534, tres_per_node = c.gpus }
  slurm_job_submit(jd, PARTS, 1000)
  local rc = "-"
  if c.modify_to or c.modify_tasks_per_gpu then  -- then uid 1000 changes the pending job
    local rec = { job_id = 7, user_name = "bob", name = "x", partition = c.partition or "main",
                  admin_comment = jd.admin_comment, tres_fmt_req_str = c.req }
    local upd = { partition = c.modify_to, shared = 65534, ntasks_per_tres = c.modify_tasks_per_gpu or 65534 }
    rc = tostring(slurm_job_modify(upd, rec, PARTS, 1000))
  end
  print(i .. " " .. tostring(jd.admin_comment) .. " " .. tostring(jd.features) .. " " .. rc)
end
"""


def test_gpus_implied_by_ntasks_per_gpu_are_decided(tmp_path: Path) -> None:
    """``sbatch --ntasks-per-gpu=1 -n 4`` names no GPU field, yet slurmctld gives the job 4 GPUs
    (gres_job_state_validate derives ``gres/gpu:4`` from the task count, 22.05 to 25.11): read as
    "no GPU request" a memory job ran uncapped, a cap escape open to every user. And a pending job
    whose requested TRES lists GPUs is one, for a user's ``scontrol update`` too."""
    from wattclass.plugin.decide import tasks_per_gpu_set

    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"},
                        "placement": {"memory": {"features": ["hbm"]}}, "exempt": {"partitions": ["debug"]}})
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "bob", None, None, "memory", 0.9, 3, "rule")],
                      pol.table_dict({"hbm"}))
    req = "cpu=1,mem=1000M,node=1,billing=1,gres/gpu=1"
    cases = [{"ntasks_per_tres": 1},  # --ntasks-per-gpu=1
             {"ntasks_per_tres": 4},
             {},  # unset (NO_VAL16): a CPU job, unchanged
             {"ntasks_per_tres": 0},
             # exempt at submission, then moved by its user to a capped partition: refused
             {"ntasks_per_tres": 1, "partition": "debug", "modify_to": "main", "req": req},
             # a CPU job may still move (its requested TRES has no GPU)
             {"partition": "debug", "modify_to": "main", "req": "cpu=1,mem=1000M,node=1,billing=1"},
             # but not gain GPUs by an update RPC carrying ntasks_per_tres (libslurm; scontrol has none)
             {"modify_tasks_per_gpu": 1, "req": "cpu=1,mem=1000M,node=1,billing=1"}]
    rows = _run_lua(render_job_submit(table), cases, tmp_path, driver=TASKS_PER_GPU_DRIVER)
    assert [r[1].startswith("wattclass:label=memory;") for r in rows] == [True, True] + [False] * 5, rows
    assert [r[2] for r in rows[:4]] == ["hbm", "hbm", "nil", "nil"], rows  # placement: a GPU job
    assert [r[3] for r in rows[4:]] == ["-1", "0", "-1"], rows  # slurm.ERROR, slurm.SUCCESS
    python = [tasks_per_gpu_set(c.get("ntasks_per_tres", 65534)) for c in cases[:4]]  # the mirror agrees
    assert python == [True, True, False, False]


ALTERNATE_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
-- state_up: 3 UP (submit + schedule), 2 DRAIN, 1 DOWN (submit only), 0 INACTIVE
local PARTS = { main = { flag_default = 1, max_share = 1, state_up = 3 },
                debug = { flag_default = 0, max_share = 1, state_up = DEBUG_STATE, alternate = DEBUG_ALT },
                spare = { flag_default = 0, max_share = 1, state_up = 2, alternate = "debug" } }
for i, c in ipairs(CASES) do
  local jd = { user_name = "bob", name = "x", shared = 65534, ntasks_per_tres = 65534,
               partition = c.partition, tres_per_node = "gres/gpu:1" }
  slurm_job_submit(jd, PARTS, 1000)
  print(i .. " " .. tostring(jd.admin_comment))
end
"""


@pytest.mark.parametrize(("state_up", "alternate", "exempt"), [
    (3, "main", True),  # UP: the job runs in debug, exempt
    (1, "main", True),  # DOWN still takes submissions: stays in debug
    (2, "main", False),  # DRAIN: handed to main, decided
    (0, "main", False),  # INACTIVE: likewise
    (2, None, True),  # DRAIN without an alternate: Slurm refuses the job; nothing to decide here
    (2, "spare", True),  # an alternate loop (debug -> spare -> debug): Slurm refuses it
])
def test_a_drained_exempt_partition_hands_its_jobs_to_its_alternate(
        tmp_path: Path, state_up: int, alternate: str | None, exempt: bool) -> None:
    """A partition that takes no submissions (DRAIN, INACTIVE) passes a job submitted to it on to
    its ``Alternate=`` chain (slurmctld's _alt_part_test, after job_submit): a memory job sent to a
    drained exempt partition with Alternate=main ran in main without a decision, uncapped."""
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"},
                        "exempt": {"partitions": ["debug"]}})
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "bob", None, None, "memory", 0.9, 3, "rule")],
                      pol.table_dict(set()))
    driver = f"DEBUG_STATE = {state_up}\nDEBUG_ALT = {lua_value(alternate)}\n" + ALTERNATE_DRIVER
    rows = _run_lua(render_job_submit(table), [{"partition": "debug"}, {"partition": "main"}], tmp_path,
                    driver=driver)
    decided = "wattclass:label=memory;conf=0.90;cap=60%;src=rule;mode=enforce"
    assert rows[0][1] == ("nil" if exempt else decided)
    assert rows[1][1].startswith("wattclass:label=memory;")


RESERVATION_DRIVER = SLURM_SILENT + r"""
dofile(SCRIPT)
slurm.reservations = { bench = { partition = "debug" }, plain = { partition = nil } }
local PARTS = { main = { flag_default = 1, max_share = 1, state_up = 3 },
                debug = { flag_default = 0, max_share = 1, state_up = 3 } }
for i, c in ipairs(CASES) do
  local jd = { user_name = "bob", name = "x", shared = 65534, ntasks_per_tres = 65534,
               partition = c.partition, reservation = c.reservation, tres_per_node = "gres/gpu:1" }
  slurm_job_submit(jd, PARTS, 1000)
  print(i .. " " .. tostring(jd.admin_comment ~= nil))
end
"""


@pytest.mark.parametrize(("exempt", "want"), [
    # debug exempt: a job of reservation bench (PartitionName=debug) without -p runs in debug
    ("debug", ["false", "true", "true", "true"]),
    # main, the default, exempt: the same job runs in debug, capped (it ran uncapped as "main")
    ("main", ["true", "false", "false", "false"]),
])
def test_a_job_without_a_partition_runs_in_its_reservations_partition(
        tmp_path: Path, exempt: str, want: list[str]) -> None:
    """slurmctld puts a job that names no partition but a reservation into the reservation's
    partition (_get_job_parts), not the default one; job_submit.lua judged the default one."""
    pol = parse_policy({"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%"},
                        "exempt": {"partitions": [exempt]}})
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "bob", None, None, "memory", 0.9, 3, "rule")],
                      pol.table_dict(set()))
    cases = [{"reservation": "bench"},
             {"reservation": "bench", "partition": "main"},  # an explicit -p wins
             {"reservation": "plain"},  # a reservation without a partition: the default
             {"reservation": "gone"}]  # unknown here: the default (slurmctld refuses it anyway)
    rows = _run_lua(render_job_submit(table), cases, tmp_path, driver=RESERVATION_DRIVER)
    assert [r[1] for r in rows] == want, rows
