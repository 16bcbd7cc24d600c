--[[ wattclass job_submit.lua (Slurm job_submit/lua, Lua 5.1; install next to slurm.conf)

At submission a job has no history yet, so the nightly run writes a label table (a line-based
DATA file, format in wattclass/labeltable.py) with the policy's decision per label. This script
looks the job up (user + job name, user, account; a key below its label's min_confidence falls
through to the next) and, for a GPU job (one that asks for a GPU, or a whole-node job, which Slurm
gives every GPU of its nodes) that is labelled and not exempt, writes the decision into admin_comment
(which users cannot set) for the Prolog, and in enforce mode adds placement features when the user
gave no constraint.

Fail-open at submission: every step runs under pcall; a missing, corrupt or unsafe table (a
symlink, or the file or a folder above it owned by a non-root user or writable by group/others)
or any error leaves the job exactly as submitted and logs why. The table is parsed with plain
string functions (string.find with plain=true) and is never run; it is re-read only when its
mtime/size/inode change (cached in the global WATTCLASS_TABLE_CACHE); at most MAX_BYTES bytes are
read (the rest is ignored and logged). User strings (job name, comment) are only ever table keys or
the subject of our own fixed patterns; never a pattern, never a format string, never a shell, and
they are clipped to LOG_MAX bytes in log lines.

slurm_job_modify re-decides a pending job when its partition, account or GPU request changes
(users may `scontrol update` those). Users cannot set admin_comment, so a change that would change
the decision is refused for them (cancel and resubmit instead); for root the new decision is
written.

Keep the logic in step with wattclass/plugin/decide.py (a parity test runs both).
]]

-- Site configuration (wattclass plugin install-lua rewrites this line).
local LABEL_TABLE = "/etc/slurm/wattclass/labels.tsv"

local PREFIX = "wattclass:"
local TABLE_HEADER = "wattclass-labels\t2"
local MAX_BYTES = 16 * 1024 * 1024  -- read at most this much of the table (labeltable.MAX_BYTES)
local LOG_MAX = 200  -- bytes of one user string in a log line
local GPU_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket", "gres" }

local find, sub = string.find, string.sub

-- lua-posix gives lstat (mode, owner, mtime, inode); without it the table cannot be checked,
-- so the script stays passive.
local have_posix, pstat = pcall(require, "posix.sys.stat")
local have_pwd, ppwd = pcall(require, "posix.pwd")

-- A user string made safe for one log line: at most LOG_MAX bytes, control bytes, backslash and
-- non-ASCII as \ddd, and the original length when it was cut.
local function clip(s)
  if s == nil then return "nil" end
  s = tostring(s)
  -- the common case, a short printable name, is returned as it is (no gsub callback per byte)
  if #s <= LOG_MAX and not find(s, "[%c\\\127-\255]") then return s end
  local extra = ""
  if #s > LOG_MAX then
    extra = "...(" .. #s .. " bytes)"
    s = sub(s, 1, LOG_MAX)
  end
  return (string.gsub(s, "[%c\\\127-\255]", function(c)
    return string.format("\\%03d", string.byte(c))
  end)) .. extra
end

local function log_info(msg) slurm.log_info("%s", msg) end
-- One line per submitted job goes to the verbose level: a log line costs slurmctld about 35 us
-- of a submission's ~0.1 ms inside job_submit (docs/benchmarks.md), and admin_comment already
-- records every decision in the job. SlurmctldDebug=verbose (or `scontrol setdebug verbose`)
-- shows each job's outcome and reason; problems with the table stay at info/error.
-- slurm.log(level, msg) is the C function under slurm.log_verbose, without its string.format.
local slurm_log = type(slurm.log) == "function" and slurm.log or nil
local function log_job(msg)
  if slurm_log then slurm_log(1, msg) else slurm.log_verbose("%s", msg) end
end
local function log_error(msg) slurm.log_error("%s", msg) end

-- -- the table file: trust checks -------------------------------------------------------------
local function bit_set(mode, bit) return math.floor(mode / bit) % 2 == 1 end

-- Owned by root, not writable by group or others (a sticky folder is fine), not a symlink.
local function unsafe(path, st, is_dir)
  if pstat.S_ISLNK(st.st_mode) ~= 0 then return path .. " is a symlink" end
  if st.st_uid ~= 0 then return path .. " is not owned by root" end
  local group_or_other = bit_set(st.st_mode, 16) or bit_set(st.st_mode, 2)
  if group_or_other and not (is_dir and bit_set(st.st_mode, 512)) then
    return path .. " is writable by group or others"
  end
  return nil
end

-- Every folder from the table's up to "/" must be trusted too: whoever can rename a folder above
-- the table can replace it.
local function unsafe_folders(path)
  local dir = path
  while true do
    local cut = nil
    local start = 1
    while true do
      local i = find(dir, "/", start, true)
      if not i then break end
      cut, start = i, i + 1
    end
    if cut == nil then return nil end
    dir = sub(dir, 1, cut - 1)
    local shown = dir
    if shown == "" then shown = "/" end
    local st = pstat.lstat(shown)
    if st == nil then return shown .. " not found" end
    local why = unsafe(shown, st, true)
    if why then return why end
    if dir == "" then return nil end
  end
end

-- -- the table file: parsing -----------------------------------------------------------------
local function split_tabs(line)
  local f, start = {}, 1
  while true do
    local i = find(line, "\t", start, true)
    if not i then
      f[#f + 1] = sub(line, start)
      return f
    end
    f[#f + 1] = sub(line, start, i - 1)
    start = i + 1
  end
end

-- Inverse of labeltable.encode_field: "%" alone is "", %XX is one byte; nil on a bad escape.
local function decode(s)
  if s == "%" then return "" end
  if not find(s, "%", 1, true) then return s end
  local out, start = {}, 1
  while true do
    local i = find(s, "%", start, true)
    if not i then
      out[#out + 1] = sub(s, start)
      return table.concat(out)
    end
    local hx = sub(s, i + 1, i + 2)
    local n = tonumber(hx, 16)
    if #hx ~= 2 or n == nil or find(hx, "[^0-9A-F]") then return nil end
    out[#out + 1] = sub(s, start, i - 1)
    out[#out + 1] = string.char(n)
    start = i + 3
  end
end

local function new_table()
  return { version = 2, by_user_name = {}, by_user = {}, by_account = {},
           policy = { decisions = {}, features_available = {}, min_confidence_by_label = {},
                      exempt = { partitions = {}, accounts = {}, users = {} } } }
end

local EXEMPT_KIND = { partition = "partitions", account = "accounts", user = "users" }
local LABELS = { compute = true, memory = true, mixed = true, idle = true }  -- labeltable.LABELS

local function split_commas(s)
  local out, start = {}, 1
  while true do
    local i = find(s, ",", start, true)
    out[#out + 1] = sub(s, start, (i or 0) - 1)
    if not i then return out end
    start = i + 1
  end
end

-- A threshold as Python's float() reads it: Lua's tonumber also takes hexadecimal ("0x1"), which
-- the Python reader refuses, so the two would decide differently on a hand-edited table.
local function decimal(s)
  if string.find(s, "x", 1, true) or string.find(s, "X", 1, true) then return nil end
  return tonumber(s)
end

-- An entry's record is kept as its text "label TAB confidence TAB n TAB source" and parsed only
-- when a job hits it: at 1M keys one string per key instead of one Lua table halves the load
-- time and memory (docs/benchmarks.md). A malformed record counts as no entry.
local function record(s)
  if type(s) ~= "string" then return nil end
  local f = split_tabs(s)
  if #f ~= 4 then return nil end
  local conf, src = tonumber(f[2]), decode(f[4])
  if conf == nil or src == nil then return nil end
  return { label = f[1], confidence = conf, n = tonumber(f[3]) or 0, source = src }
end

-- "entry TAB level TAB key1 TAB key2 TAB record" into t, without splitting the record.
local function parse_entry(t, line)
  local a = find(line, "\t", 7, true)
  local b = a and find(line, "\t", a + 1, true)
  local c = b and find(line, "\t", b + 1, true)
  if c == nil then return "bad entry" end
  local level = sub(line, 7, a - 1)
  local k1, k2 = decode(sub(line, a + 1, b - 1)), decode(sub(line, b + 1, c - 1))
  if k1 == nil or k2 == nil then return "bad entry key" end
  local rec = sub(line, c + 1)
  if level == "user_name" then
    local names = t.by_user_name[k1]
    if names == nil then
      names = {}
      t.by_user_name[k1] = names
    end
    names[k2] = rec
  elseif level == "user" then
    t.by_user[k1] = rec
  elseif level == "account" then
    t.by_account[k1] = rec
  else
    return "unknown level"
  end
  return nil
end

-- One non-entry line (already split) into t; returns an error text or nil.
local function parse_line(t, f)
  local kind, n = f[1], #f
  if kind == "generated_at" and n == 2 then
    t.generated_at = f[2]
  elseif kind == "mode" and n == 2 then
    t.policy.mode = f[2]
    t.has_policy = true
  elseif kind == "min_confidence" and n == 2 then
    local v = decimal(f[2])
    if v == nil or not (v >= 0 and v <= 1) then return "bad min_confidence" end  -- nan, 80 (%)
    t.policy.min_confidence = v
  elseif kind == "min_confidence_label" and n == 3 and LABELS[f[2]] then
    local v = decimal(f[3])
    if v == nil or not (v >= 0 and v <= 1) then return "bad min_confidence_label" end
    t.policy.min_confidence_by_label[f[2]] = v
  elseif kind == "canary_threshold" and n == 2 then
    -- digits only, as the Python reader: tonumber also takes "1e3" and "100.0"
    local v = string.find(f[2], "^%d+$") and tonumber(f[2]) or nil
    if v == nil or v > 10000 then return "bad canary_threshold" end
    t.policy.canary_threshold = v
  elseif kind == "decision" and n == 4 then
    local cap, feats = f[3], {}
    if cap == "-" then cap = nil end
    if f[4] ~= "-" then feats = split_commas(f[4]) end
    t.policy.decisions[f[2]] = { cap = cap, features = feats }
  elseif kind == "feature" and n == 2 then
    local name = decode(f[2])
    if name == nil then return "bad feature" end
    t.policy.features_available[name] = true
  elseif kind == "exempt" and n == 3 and EXEMPT_KIND[f[2]] then
    local name = decode(f[3])
    if name == nil then return "bad exempt" end
    t.policy.exempt[EXEMPT_KIND[f[2]]][name] = true
  elseif sub(kind, 1, 1) ~= "#" then
    return "unknown record"
  end
  return nil
end

-- Parse the text of a table; returns the table or nil, error.
local function parse_table(data, truncated)
  local nl = find(data, "\n", 1, true)
  if nl == nil or sub(data, 1, nl - 1) ~= TABLE_HEADER then
    return nil, "label table is not a version 2 wattclass table (bad first line)"
  end
  local t, start, lineno = new_table(), nl + 1, 1
  local len = #data
  while start <= len do
    local i = find(data, "\n", start, true)
    if i == nil then
      if truncated then break end  -- the partial last line past MAX_BYTES
      i = len + 1
    end
    lineno = lineno + 1
    if i > start then
      local line = sub(data, start, i - 1)
      local why
      if sub(line, 1, 6) == "entry\t" then
        why = parse_entry(t, line)
      else
        why = parse_line(t, split_tabs(line))
      end
      if why then return nil, "label table line " .. lineno .. ": " .. why end
    end
    start = i + 1
  end
  t.policy.min_confidence = t.policy.min_confidence or 1
  -- Which job fields the decision can depend on: each one read from job_desc costs slurmctld a
  -- C call per submission (the account even an accounting lookup), so resolve_submit reads the
  -- account only when some key or exemption names one, the partition likewise.
  t.uses_account = next(t.by_account) ~= nil or next(t.policy.exempt.accounts) ~= nil
  t.uses_partition = next(t.policy.exempt.partitions) ~= nil
  t.uses_features = t.policy.mode == "enforce" and next(t.policy.features_available) ~= nil
  return t, nil
end

local function read_table(path)
  local fh, oerr = io.open(path, "rb")
  if fh == nil then return nil, "cannot open label table: " .. tostring(oerr) end
  local data = fh:read(MAX_BYTES) or ""
  local more = fh:read(1)
  fh:close()
  if more ~= nil then
    log_error("wattclass: label table " .. path .. " is larger than " .. MAX_BYTES ..
      " bytes: only the first " .. MAX_BYTES .. " are used")
  end
  return parse_table(data, more ~= nil)
end

-- The parsed table, re-read only when the file changes; (table, nil) or (nil, why).
local function load_table()
  if not have_posix then return nil, "lua-posix (posix.sys.stat) is not available" end
  local st = pstat.lstat(LABEL_TABLE)
  if st == nil then return nil, "label table " .. LABEL_TABLE .. " not found" end
  local cache = WATTCLASS_TABLE_CACHE
  -- ctime and gid too: an admin's chgrp/chmod that makes the table readable changes neither
  -- mtime nor size, and must not leave a cached "cannot open" in place
  if cache ~= nil and cache.ino == st.st_ino and cache.mtime == st.st_mtime and cache.size == st.st_size
      and cache.mode == st.st_mode and cache.uid == st.st_uid and cache.gid == st.st_gid
      and cache.ctime == st.st_ctime then
    return cache.table, cache.err
  end
  local tbl, err = nil, nil
  local why = unsafe(LABEL_TABLE, st, false) or unsafe_folders(LABEL_TABLE)
  if why then
    err = "refusing label table: " .. why
  elseif pstat.S_ISREG(st.st_mode) == 0 then
    err = "refusing label table: " .. LABEL_TABLE .. " is not a regular file"
  else
    tbl, err = read_table(LABEL_TABLE)
    if tbl ~= nil and not tbl.has_policy then
      tbl, err = nil, "label table has no policy (written without --policy): nothing to decide"
    end
  end
  WATTCLASS_TABLE_CACHE = { ino = st.st_ino, mtime = st.st_mtime, size = st.st_size, mode = st.st_mode,
                            uid = st.st_uid, gid = st.st_gid, ctime = st.st_ctime, table = tbl, err = err }
  return tbl, err
end

-- -- the decision (mirrored in decide.py) ------------------------------------------------------
local function field(t, k)
  if type(t) ~= "table" or k == nil then return nil end
  return t[k]
end

-- GPUs one gres/tres item asks for: nil when it is not a GPU item. Accepts every spelling Slurm
-- uses: "gpu:2", "gres:gpu:2" (22.05), "gres/gpu:2" (25.11), typed "gres/gpu:h200:2", "gpu",
-- "gres/gpu=2". A type without count means 1. Shares of a GPU (gres/shard, gres/mps) count too:
-- the Prolog caps the GPU they share (docs/shared-gpus.md).
local function gpu_count(item)
  local s = item
  local head = sub(s, 1, 5)
  if head == "gres:" or head == "gres/" then s = sub(s, 6) end
  local cut = find(s, ":", 1, true)
  local eq = find(s, "=", 1, true)
  if eq and (cut == nil or eq < cut) then cut = eq end
  local name = s
  if cut then name = sub(s, 1, cut - 1) end
  if name ~= "gpu" and name ~= "shard" and name ~= "mps" then return nil end
  if cut == nil then return 1 end
  local last = sub(s, cut + 1)
  while true do
    local i = find(last, ":", 1, true)
    if not i then break end
    last = sub(last, i + 1)
  end
  return tonumber(last) or 1
end

-- True when any of the strings (tres_per_node, tres_per_job, ...) asks for at least one GPU.
local function requests_gpu(specs)
  for _, spec in ipairs(specs) do
    if type(spec) == "string" and spec ~= "" and not find(spec, ",", 1, true) then
      local n = gpu_count(spec)  -- one item, the usual case: no list to build
      if n ~= nil and n > 0 then return true end
    elseif type(spec) == "string" and spec ~= "" then
      for _, item in ipairs(split_commas(spec)) do
        local n = gpu_count(item)
        if n ~= nil and n > 0 then return true end
      end
    end
  end
  return false
end

-- Exempt only when every listed partition is (a job may run in any one of them).
local function all_parts_exempt(parts, exempt)
  local any = false
  for _, part in ipairs(split_commas(parts)) do
    if part ~= "" then
      if not field(exempt, part) then return false end
      any = true
    end
  end
  return any
end

-- record() of an entry's text, parsed once per table (t.records) and reused by later jobs. The
-- record also keeps the confidence its label needs (rec.need: the policy's min_confidence_label
-- for the label, else min_confidence), so a submission compares one number per key it meets.
local function cached_record(t, s)
  if s == nil then return nil end
  local memo = t.records
  if memo == nil then
    memo = {}
    t.records = memo
  end
  local rec = memo[s]
  if rec == nil then
    rec = record(s) or false
    if rec then
      local policy = t.policy
      rec.need = tonumber(field(policy.min_confidence_by_label, rec.label))
        or tonumber(policy.min_confidence) or 1
    end
    memo[s] = rec
  end
  return rec or nil
end

-- The most specific key whose confidence reaches its label's threshold; else the most specific
-- key found (low = true), else nil.
-- (Written without a list of candidates: this runs inside every submission, where each table
-- built costs slurmctld time.)
local function lookup(t, user, name, account)
  local low_key, low_rec = nil, nil
  for i = 1, 3 do
    local key, rec = nil, nil
    if i == 1 then
      if user ~= nil and name ~= nil then key, rec = "user_name", field(field(t.by_user_name, user), name) end
    elseif i == 2 then
      if user ~= nil then key, rec = "user", field(t.by_user, user) end
    elseif account ~= nil then
      key, rec = "account", field(t.by_account, account)
    end
    rec = cached_record(t, rec)
    if rec ~= nil then
      if (tonumber(rec.confidence) or 0) >= rec.need then return key, rec, false end
      if low_rec == nil then low_key, low_rec = key, rec end
    end
  end
  return low_key, low_rec, true
end

local function format_comment(label, conf, cap, src, mode)
  local parts = { "label=" .. label, string.format("conf=%.2f", conf) }
  if cap ~= nil then parts[#parts + 1] = "cap=" .. tostring(cap) end
  parts[#parts + 1] = "src=" .. string.gsub(tostring(src), "[^%w%._:%-]", "_")
  parts[#parts + 1] = "mode=" .. mode
  return PREFIX .. table.concat(parts, ";")
end

-- Canary arm (issue 12), mirrored by wattclass/admincomment.py canary_arm: job_desc has no job id
-- at submission, so the key is user + UTC day (not the name or second, which a user could vary to
-- re-roll the arm); a polynomial hash exact in doubles.
local function canary_arm(policy, mode, user, now)
  local threshold = tonumber(policy.canary_threshold) or 0
  if threshold <= 0 then return nil end
  now = now or os.time()
  local key = (user or "") .. "\n" .. string.format("%d", math.floor(now / 86400))
  local h = 0
  for i = 1, #key do h = (h * 257 + string.byte(key, i)) % 2147483647 end
  local in_canary = (h % 10000) < threshold
  if mode == "enforce" then in_canary = not in_canary end
  if in_canary then return "capped" end
  return "control"
end

local function placement(policy, dec, mode, user_features)
  if mode ~= "enforce" or (user_features ~= nil and user_features ~= "") then return nil end
  local feats = {}
  for _, f in ipairs(dec.features or {}) do
    if field(policy.features_available, f) then feats[#feats + 1] = f end
  end
  if #feats == 0 then return nil end
  return table.concat(feats, "&")
end

-- The decision for resolved job fields; returns status, reason, admin_comment, features, label, conf.
local function decide(t, user, name, account, partition, user_features, gpu_request, now)
  if not gpu_request then return "none", "no_gpu_request" end
  -- Slurm lower-cases the account only after job_submit (validate_job_create_req) and matches
  -- associations ignoring case: `-A PHYSICS` runs in account physics, the name every key and
  -- exemption uses, so it is looked up as such (else the account key was dodged by case).
  if account ~= nil then account = string.lower(account) end
  local policy = t.policy
  local exempt = policy.exempt or {}
  if user ~= nil and field(exempt.users, user) then return "none", "exempt_user" end
  if account ~= nil and field(exempt.accounts, account) then return "none", "exempt_account" end
  if partition ~= nil and all_parts_exempt(partition, exempt.partitions) then
    return "none", "exempt_partition"
  end
  local key, rec, low = lookup(t, user, name, account)
  if rec == nil then return "none", "unknown_job" end
  local label, conf = tostring(rec.label), tonumber(rec.confidence) or 0
  if low then return "none", "low_confidence", nil, nil, label, conf end
  local dec = field(policy.decisions, label)
  if type(dec) ~= "table" then return "none", "no_decision", nil, nil, label, conf end
  local mode = "shadow"
  if policy.mode == "enforce" then mode = "enforce" end
  -- the comment depends on the record and the table's policy only: built once per record
  local comment = rec.comment
  if comment == nil then
    comment = format_comment(label, conf, dec.cap, rec.source or "", mode)
    rec.comment = comment
  end
  local arm = dec.cap ~= nil and canary_arm(policy, mode, user, now) or nil
  if arm then comment = comment .. ";arm=" .. arm end
  -- a whole-node job that asks for no GPU (gpu_request "whole_node") gets the cap, not placement
  -- features: it may be a CPU job, which features of GPU nodes would strand
  local feats = nil
  if gpu_request == true then feats = placement(policy, dec, mode, user_features) end
  return mode, mode, comment, feats, label, conf
end

-- -- Slurm's job fields -> the decision's inputs -----------------------------------------------
-- The cluster's default partition (Default=YES) among those the user may use.
local function default_partition(part_list)
  if type(part_list) ~= "table" then return nil end
  for name, part in pairs(part_list) do
    if tonumber(part.flag_default) == 1 then return name end
  end
  return nil
end

local function nonempty(v)
  if v == nil or v == "" then return nil end
  return v
end

-- A job that names no partition but a reservation runs in the reservation's partition (slurmctld's
-- _get_job_parts, 22.05 to 25.11), not the default one; nil when the reservation names none.
-- slurm.reservations: what job_submit/lua gives the script (name -> record with `partition`).
local function reservation_partition(resv)
  resv = nonempty(resv)
  local all = type(slurm.reservations) == "table" and slurm.reservations or nil
  local r = resv and all and all[resv]
  return r and nonempty(r.partition) or nil
end

-- The partitions a job submitted to `parts` (a comma list) lands in: slurmctld hands a job whose
-- partition takes no submissions (State=DRAIN or INACTIVE: no PARTITION_SUBMIT bit in state_up)
-- to that partition's Alternate= chain (_alt_part_test, 22.05 to 25.11), after job_submit. A job
-- sent to a drained exempt partition with Alternate=main ran in main as exempt, uncapped. A
-- partition this user cannot see, or a chain Slurm would refuse (a loop), is kept as named.
local PARTITION_SUBMIT = 1
local function landing_partitions(parts, part_list)
  if parts == nil or type(part_list) ~= "table" then return parts end
  local out = {}
  for _, named in ipairs(split_commas(parts)) do
    local name, seen = named, {}
    while true do
      local part = part_list[name]
      local up = part and tonumber(part.state_up)
      if up == nil or up % (2 * PARTITION_SUBMIT) >= PARTITION_SUBMIT then break end  -- lands here
      seen[name] = true
      name = nonempty(part.alternate)
      if name == nil or seen[name] then  -- no partition takes it: Slurm refuses the job
        name = named
        break
      end
    end
    out[#out + 1] = name
  end
  return table.concat(out, ",")
end

-- The partitions a submitted job will run in, as slurmctld resolves them after job_submit: its
-- -p list, else its reservation's partition, else the default one; each through Alternate=.
local function submit_partitions(job_desc, part_list)
  return landing_partitions(nonempty(job_desc.partition) or reservation_partition(job_desc.reservation)
                            or default_partition(part_list), part_list)
end

-- True when the job may run in a partition with OverSubscribe=EXCLUSIVE (max_share 0): any of
-- its comma list, or the default partition when it names none.
local function exclusive_partition(parts, part_list)
  if type(part_list) ~= "table" then return false end
  if parts == nil then
    parts = default_partition(part_list)
    if parts == nil then return false end
  end
  for _, name in ipairs(split_commas(parts)) do
    local part = name ~= "" and part_list[name] or nil
    if part ~= nil and tonumber(part.max_share) == 0 then return true end
  end
  return false
end

-- A whole-node job gets every GPU of its nodes even when it asks for none (Slurm's
-- _handle_exclusive_gres, 22.05 to 25.11): `--exclusive` (shared 0) or an OverSubscribe=EXCLUSIVE
-- partition. Without this `sbatch --exclusive` ran on all of a node's GPUs with no decision,
-- uncapped. Not seen here: `-S` (whole-node only with AllowSpecResourcesUsage=yes), as Slurm gives
-- job_submit.lua no core_spec field (22.05, 25.11), and `--reboot` (admins only).
-- Keeps the partitions it read in j.partition (submit_partitions; not read for --exclusive).
local function whole_node(job_desc, part_list, j)
  if tonumber(job_desc.shared) == 0 then return true end
  j.partition = j.partition or submit_partitions(job_desc, part_list)
  return exclusive_partition(j.partition, part_list)
end

local function gpu_specs(job_desc, job_rec)
  local specs = {}
  for _, k in ipairs(GPU_FIELDS) do
    local v = nonempty(job_desc[k])
    if v == nil and job_rec ~= nil then v = nonempty(job_rec[k]) end
    specs[#specs + 1] = v
  end
  return specs
end

-- True when any GPU field of job_desc asks for a GPU; stops at the first that does.
local function desc_requests_gpu(job_desc)
  for _, k in ipairs(GPU_FIELDS) do
    local v = job_desc[k]
    if v ~= nil and v ~= "" and requests_gpu({ v }) then return true end
  end
  return false
end

-- True when `--ntasks-per-gpu` (ntasks_per_tres) is set: with no GPU field Slurm still gives the
-- job GPUs, task count / ntasks_per_tres of them (gres_job_state_validate derives
-- "gres/gpu:<n>", 22.05 to 25.11), so `sbatch --ntasks-per-gpu=1 -n 4` ran on 4 GPUs as "no GPU
-- request", uncapped. Unset is NO_VAL16 (65534) or 0. Mirrored by decide.tasks_per_gpu_set.
local NO_VAL16 = 65534
local function tasks_per_gpu_set(v)
  local n = tonumber(v)
  return n ~= nil and n > 0 and n ~= NO_VAL16
end

-- The fields as Slurm will resolve them: no -p means the default partition; no -A means the
-- user's default account (nil without slurmdbd, so account keys and exemptions need -A then).
-- Each job_desc field is a C call inside slurmctld (one submission is a few ms, and this runs
-- in it): a job without a GPU request reads only what tells whether it gets GPUs anyway
-- (ntasks_per_tres, whole_node's fields), the account and partition are read only when the table
-- can use them (decide() gives the same answer without them then), and the user's constraint
-- only when the table may add placement features.
local function resolve_submit(t, job_desc, part_list, name)
  local j = { user = job_desc.user_name, name = name, gpu = desc_requests_gpu(job_desc) }
  if not j.gpu and tasks_per_gpu_set(job_desc.ntasks_per_tres) then j.gpu = true end
  if not j.gpu then
    if not whole_node(job_desc, part_list, j) then return j end
    j.gpu = "whole_node"
  end
  if t.uses_features then j.features = job_desc.features end
  if t.uses_account then
    j.account = nonempty(job_desc.account) or nonempty(job_desc.default_account)
  end
  if t.uses_partition then
    j.partition = j.partition or submit_partitions(job_desc, part_list)
  end
  return j
end

local function decide_job(t, j)
  return decide(t, j.user, j.name, j.account, j.partition, j.features, j.gpu)
end

local function submit(job_desc, part_list)
  local t, err = load_table()
  local name = job_desc.name
  local jname = clip(name)
  if t == nil then
    log_info("wattclass: job name=" .. jname .. " unchanged: " .. tostring(err))
    return
  end
  local j = resolve_submit(t, job_desc, part_list, name)
  local status, reason, comment, features = decide_job(t, j)
  local who = "wattclass: job name=" .. jname .. " user=" .. clip(j.user)
  if status == "none" then
    log_job(who .. " unchanged: " .. reason)
    return
  end
  local old = job_desc.admin_comment
  if old ~= nil and old ~= "" then comment = old .. " " .. comment end
  job_desc.admin_comment = comment
  if features ~= nil then job_desc.features = features end
  log_job(who .. " " .. status .. " " .. clip(comment) .. " features=" .. clip(features))
end

-- -- slurm_job_modify --------------------------------------------------------------------------
local function changes_decision_inputs(job_desc)
  if nonempty(job_desc.partition) or nonempty(job_desc.account) then return true end
  -- scontrol has no NtasksPerTRES, but an update RPC (libslurm) may carry one: GPUs for a CPU job
  if tasks_per_gpu_set(job_desc.ntasks_per_tres) then return true end
  for _, k in ipairs(GPU_FIELDS) do
    if nonempty(job_desc[k]) then return true end
  end
  return false
end

-- The wattclass token of an admin_comment and the text around it.
local function split_token(admin_comment)
  if admin_comment == nil then return nil, "" end
  local i = find(admin_comment, PREFIX, 1, true)
  if i == nil then return nil, admin_comment end
  local j = find(admin_comment, " ", i, true) or (#admin_comment + 1)
  local rest = sub(admin_comment, 1, i - 1) .. sub(admin_comment, j + 1)
  if sub(rest, -1) == " " then rest = sub(rest, 1, -2) end
  return sub(admin_comment, i, j - 1), rest
end

-- What a comment means for the GPUs (label, cap, mode), without confidence or source.
local function effect(token)
  if token == nil then return "none" end
  local out = {}
  for _, part in ipairs(split_commas(string.gsub(sub(token, #PREFIX + 1), ";", ","))) do
    local k = sub(part, 1, 5)
    if k == "label" or sub(part, 1, 4) == "cap=" or sub(part, 1, 5) == "mode=" then out[#out + 1] = part end
  end
  if #out == 0 then return "none" end
  return table.concat(out, ";")
end

-- The job owner's name: Slurm 22.05 gives job_rec no user_name, only user_id.
local function owner_name(job_desc, job_rec)
  local name = nonempty(job_rec.user_name) or nonempty(job_desc.user_name)
  if name ~= nil or not have_pwd then return name end
  local pw = ppwd.getpwuid(tonumber(job_rec.user_id) or -1)
  if pw == nil then return nil end
  return pw.pw_name
end

local function modify(job_desc, job_rec, part_list, modify_uid)
  if not changes_decision_inputs(job_desc) then return slurm.SUCCESS end
  local t, err = load_table()
  if t == nil then
    log_info("wattclass: modify job " .. clip(job_rec.job_id) .. " unchanged: " .. tostring(err))
    return slurm.SUCCESS
  end
  local j = {
    user = owner_name(job_desc, job_rec), name = nonempty(job_desc.name) or job_rec.name,
    account = nonempty(job_desc.account) or nonempty(job_rec.account),
    partition = landing_partitions(nonempty(job_desc.partition), part_list) or nonempty(job_rec.partition),
    features = nonempty(job_desc.features) or job_rec.features,
  }
  local specs = gpu_specs(job_desc, job_rec)
  local old_token, rest = split_token(job_rec.admin_comment)
  j.gpu = requests_gpu(specs)
  -- GPUs no GPU field names (`--ntasks-per-gpu`, which job_rec does not show): the requested TRES
  -- list has them ("...,gres/gpu=2") where slurm.conf's AccountingStorageTRES tracks gres/gpu;
  -- or the update itself sets ntasks_per_tres
  if not j.gpu and (tasks_per_gpu_set(job_desc.ntasks_per_tres)
                    or requests_gpu({ job_rec.tres_fmt_req_str })) then
    j.gpu = true
  end
  -- whole-node now (moved to an exclusive partition), or decided at submission without any GPU
  -- field, which only a whole-node job is (job_rec does not say it is exclusive). An operator's
  -- OverSubscribe=no is neither: Slurm's update sets share_res, not whole_node (_update_job), so
  -- it gives the job no GPU and is no decision input.
  if not j.gpu and (exclusive_partition(j.partition, part_list)
                    or (#specs == 0 and effect(old_token) ~= "none")) then
    j.gpu = "whole_node"
  end
  local status, reason, comment = decide_job(t, j)
  if effect(comment) == effect(old_token) then return slurm.SUCCESS end
  local who = "wattclass: modify job " .. clip(job_rec.job_id) .. " by uid " .. clip(modify_uid)
  if tonumber(modify_uid) == 0 then
    -- Slurm ignores an empty admin_comment, so "no decision" is written as a token the Prolog
    -- does not take as a cap.
    local new = comment or (PREFIX .. "decision=none;reason=" .. reason)
    if rest ~= "" then new = rest .. " " .. new end
    job_desc.admin_comment = new
    log_info(who .. ": re-decided " .. status .. " (" .. reason .. ") " .. clip(comment))
    return slurm.SUCCESS
  end
  log_info(who .. " refused: the change would alter the power decision from " .. clip(effect(old_token)) ..
    " to " .. clip(effect(comment)))
  -- slurm.log_user is not supported in job_modify (22.05, 25.11): the user sees Slurm's generic
  -- error; docs/slurm.md tells users to cancel and resubmit instead.
  return slurm.ERROR
end

-- -- entry points --------------------------------------------------------------------------------
function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(submit, job_desc, part_list)
  if not ok then
    log_error("wattclass: error, job name=" .. clip(job_desc and job_desc.name) ..
      " left unchanged: " .. clip(err))
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local ok, rc = pcall(modify, job_desc, job_rec, part_list, modify_uid)
  if not ok then
    log_error("wattclass: error in modify, job left unchanged: " .. clip(rc))
    return slurm.SUCCESS
  end
  return rc
end

-- Exposed for the parity and unit tests (tests/test_plugin_decide.py); slurmctld ignores them.
wattclass_decide = decide
wattclass_load_table = load_table
wattclass_read_table = read_table
wattclass_record = record
wattclass_requests_gpu = requests_gpu
wattclass_clip = clip

return slurm.SUCCESS
