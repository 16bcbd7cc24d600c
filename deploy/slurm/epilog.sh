#!/bin/sh
# wattclass Epilog wrapper: slurmd runs it as root with no PATH, so every path is absolute.
# It ALWAYS exits 0: a non-zero Epilog drains the node,
# and a wattclass failure must never do that. Failures still show: the Python side logs them
# (with the job id) to its --log file, and this wrapper sends a non-zero exit (e.g.
# ModuleNotFoundError from a wrong PYTHON) and every ERROR line to syslog / the journal
# (`journalctl -t wattclass-epilog`).
# Isolation: it runs from / with `python -I` (no PYTHON* variables, no user site, and nothing
# imported from the current folder), so files planted in slurmd's working folder are never run.
# Install: /etc/slurm/wattclass/epilog.sh, owner root, mode 0755; slurm.conf Epilog=<that path>.
# `wattclass plugin install-hooks` rewrites the PYTHON= and WATTCLASS_ARGS= lines; PYTHON is the
# interpreter of the wattclass install (/opt/wattclass/bin/python, see docs/admin.md).
PYTHON=/opt/wattclass/bin/python
WATTCLASS_ARGS="--backend nvml --log /var/log/wattclass/plugin.log"
LOGGER="/usr/bin/logger"

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
cd / || exit 0
# shellcheck disable=SC2086  # WATTCLASS_ARGS is site configuration, split on purpose
err=$("$PYTHON" -I -m wattclass.plugin.prolog epilog $WATTCLASS_ARGS </dev/null 2>&1 >/dev/null)
rc=$?
# shellcheck disable=SC2086  # LOGGER may carry options
if [ "$rc" -ne 0 ]; then
  $LOGGER -t wattclass-epilog -p daemon.err -- "job ${SLURM_JOB_ID:-?}: epilog exited $rc (job continues): $(printf '%s\n' "$err" | tail -n 5 | tr -c '[:print:]\n' '?' | cut -c1-400 | tr '\n' '|')" 2>/dev/null
else
  printf '%s\n' "$err" | grep ' ERROR ' | head -n 20 | tr -c '[:print:]\n' '?' | cut -c1-400 |
    while IFS= read -r line; do $LOGGER -t wattclass-epilog -p daemon.err -- "$line" 2>/dev/null; done
fi
exit 0
