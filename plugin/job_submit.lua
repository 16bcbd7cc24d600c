--[[ wattclass job_submit.lua (Slurm job_submit/lua, Lua 5.1; install next to slurm.conf)

At submission a job has no history yet, so the nightly run writes a label table (Lua data, see
wattclass/labeltable.py) with the policy's decision per label. This script looks the job
up (user + job name, user, account) and, for a labelled, non-exempt job with enough confidence,
writes the decision into admin_comment (which users cannot set) for the Prolog, and in enforce
mode adds placement features when the user gave no constraint.

Fail-open: every step runs under pcall; a missing, corrupt or unsafe table (writable by group
or others, not owned by root), or any error leaves the job exactly as submitted and logs why.
User strings (job name, comment) are only ever table keys or the subject of our own fixed
patterns; never a pattern, never a format string, never a shell.

Keep the logic in step with wattclass/plugin/decide.py (a parity test runs both).
]]

-- Site configuration (wattclass plugin install-lua rewrites this line).
local LABEL_TABLE = "/etc/slurm/wattclass/labels.lua"

local PREFIX = "wattclass:"

-- lua-posix gives stat (mode, owner, mtime, inode); without it the table cannot be checked,
-- so the script stays passive.
local have_posix, pstat = pcall(require, "posix.sys.stat")

local cache = { key = nil, table = nil, err = nil }

local function log_info(msg) slurm.log_info("%s", msg) end
local function log_error(msg) slurm.log_error("%s", msg) end

-- A user string made safe for one log line: bytes outside [A-Za-z0-9._-] become \ddd.
local function esc(s)
  if s == nil then return "nil" end
  return (string.gsub(tostring(s), "[^%w%._%-]", function(c)
    return string.format("\\%03d", string.byte(c))
  end))
end

local function bit_set(mode, bit) return math.floor(mode / bit) % 2 == 1 end

-- Owned by root, not writable by group or others (a sticky folder is fine).
local function unsafe(path, st, is_dir)
  if st.st_uid ~= 0 then return path .. " is not owned by root" end
  local group_or_other = bit_set(st.st_mode, 16) or bit_set(st.st_mode, 2)
  if group_or_other and not (is_dir and bit_set(st.st_mode, 512)) then
    return path .. " is writable by group or others"
  end
  return nil
end

local function load_table()
  if not have_posix then return nil, "lua-posix (posix.sys.stat) is not available" end
  local st = pstat.stat(LABEL_TABLE)
  if st == nil then return nil, "label table " .. LABEL_TABLE .. " not found" end
  local key = st.st_ino .. ":" .. st.st_mtime .. ":" .. st.st_size .. ":" .. st.st_mode .. ":" .. st.st_uid
  if cache.key == key then return cache.table, cache.err end
  local dir = string.match(LABEL_TABLE, "^(.*)/[^/]*$") or "."
  local dst = pstat.stat(dir)
  local why = unsafe(LABEL_TABLE, st, false) or (dst and unsafe(dir, dst, true))
  local tbl, err = nil, nil
  if why then
    err = "refusing label table: " .. why
  else
    local chunk, lerr = loadfile(LABEL_TABLE)
    if not chunk then
      err = "cannot load label table: " .. tostring(lerr)
    else
      setfenv(chunk, {})  -- data only: the file gets no globals (no os, io, require)
      local ok, t = pcall(chunk)
      if not ok then
        err = "label table failed: " .. tostring(t)
      elseif type(t) ~= "table" or t.version ~= 1 or type(t.policy) ~= "table" then
        err = "label table is not a version 1 wattclass table"
      else
        tbl = t
      end
    end
  end
  cache.key, cache.table, cache.err = key, tbl, err
  return tbl, err
end

local function field(t, k)
  if type(t) ~= "table" then return nil end
  return t[k]
end

local function lookup(t, user, name, account)
  if user ~= nil and name ~= nil then
    local rec = field(field(t.by_user_name, user), name)
    if type(rec) == "table" then return "user_name", rec end
  end
  if user ~= nil then
    local rec = field(t.by_user, user)
    if type(rec) == "table" then return "user", rec end
  end
  if account ~= nil then
    local rec = field(t.by_account, account)
    if type(rec) == "table" then return "account", rec end
  end
  return nil, nil
end

-- Split on commas without patterns (partition lists come from the user).
local function any_part_exempt(parts, exempt)
  local start = 1
  while true do
    local i = string.find(parts, ",", start, true)
    local part = string.sub(parts, start, (i or 0) - 1)
    if field(exempt, part) then return true end
    if not i then return false end
    start = i + 1
  end
end

local function format_comment(label, conf, cap, src, mode)
  local parts = { "label=" .. label, string.format("conf=%.2f", conf) }
  if cap ~= nil then parts[#parts + 1] = "cap=" .. tostring(cap) end
  parts[#parts + 1] = "src=" .. string.gsub(tostring(src), "[^%w%._:%-]", "_")
  parts[#parts + 1] = "mode=" .. mode
  return PREFIX .. table.concat(parts, ";")
end

-- Canary arm (issue 12), mirrored by wattclass/admincomment.py canary_arm: job_desc has no job id
-- at submission, so the key is user + name + submission second; a polynomial hash exact in doubles.
local function canary_arm(policy, mode, user, name, now)
  local threshold = tonumber(policy.canary_threshold) or 0
  if threshold <= 0 then return nil end
  local key = (user or "") .. "\n" .. (name or "") .. "\n" .. string.format("%d", now)
  local h = 0
  for i = 1, #key do h = (h * 257 + string.byte(key, i)) % 2147483647 end
  local in_canary = (h % 10000) < threshold
  if mode == "enforce" then in_canary = not in_canary end
  if in_canary then return "capped" end
  return "control"
end

-- The decision; returns status, reason, admin_comment, features, label, conf.
local function decide(t, user, name, account, partition, user_features, now)
  local policy = t.policy
  local exempt = policy.exempt or {}
  if user ~= nil and field(exempt.users, user) then return "none", "exempt_user" end
  if account ~= nil and field(exempt.accounts, account) then return "none", "exempt_account" end
  if partition ~= nil and any_part_exempt(partition, exempt.partitions) then
    return "none", "exempt_partition"
  end
  local key, rec = lookup(t, user, name, account)
  if rec == nil then return "none", "unknown_job" end
  local label, conf = tostring(rec.label), tonumber(rec.confidence) or 0
  local src = rec.source or ""
  if conf < (tonumber(policy.min_confidence) or 1) then
    return "none", "low_confidence", nil, nil, label, conf
  end
  local dec = field(policy.decisions, label)
  if type(dec) ~= "table" then return "none", "no_decision", nil, nil, label, conf end
  local mode = "shadow"
  if policy.mode == "enforce" then mode = "enforce" end
  local comment = format_comment(label, conf, dec.cap, src, mode)
  local arm = dec.cap ~= nil and canary_arm(policy, mode, user, name, now or os.time()) or nil
  if arm then comment = comment .. ";arm=" .. arm end
  local features = nil
  if mode == "enforce" and (user_features == nil or user_features == "") then
    local feats = {}
    for _, f in ipairs(dec.features or {}) do
      if field(policy.features_available, f) then feats[#feats + 1] = f end
    end
    if #feats > 0 then features = table.concat(feats, "&") end
  end
  return mode, mode, comment, features, label, conf
end

local function submit(job_desc)
  local t, err = load_table()
  local jname = esc(job_desc.name)
  if t == nil then
    log_info("wattclass: job name=" .. jname .. " unchanged: " .. tostring(err))
    return
  end
  local status, reason, comment, features = decide(t, job_desc.user_name, job_desc.name,
    job_desc.account, job_desc.partition, job_desc.features)
  if status == "none" then
    log_info("wattclass: job name=" .. jname .. " user=" .. esc(job_desc.user_name) ..
      " unchanged: " .. reason)
    return
  end
  local old = job_desc.admin_comment
  if old ~= nil and old ~= "" then comment = old .. " " .. comment end
  job_desc.admin_comment = comment
  if features ~= nil then job_desc.features = features end
  log_info("wattclass: job name=" .. jname .. " user=" .. esc(job_desc.user_name) .. " " ..
    status .. " " .. comment .. " features=" .. tostring(features))
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(submit, job_desc)
  if not ok then
    log_error("wattclass: error, job name=" .. esc(job_desc and job_desc.name) ..
      " left unchanged: " .. tostring(err))
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

-- Exposed for the parity test (tests/test_plugin_decide.py); slurmctld ignores it.
wattclass_decide = decide
wattclass_load_table = load_table

return slurm.SUCCESS
