#!/bin/sh
# wattclass Prolog wrapper: slurmd runs it as root with no PATH, so every path is absolute.
# It ALWAYS exits 0: a non-zero Prolog drains the node and requeues the job, and a wattclass
# failure must never do that (the Python side logs its errors with the job id).
# Install: /etc/slurm/wattclass/prolog.sh, owner root, mode 0755; slurm.conf Prolog=<that path>.
# `wattclass plugin install-hooks` rewrites the two lines below.
PYTHON=/usr/bin/python3
WATTCLASS_ARGS="--backend nvml --log /var/log/wattclass/plugin.log"

# shellcheck disable=SC2086  # WATTCLASS_ARGS is site configuration, split on purpose
"$PYTHON" -m wattclass.plugin.prolog prolog $WATTCLASS_ARGS </dev/null >/dev/null 2>&1
exit 0
