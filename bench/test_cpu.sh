#!/bin/bash
# The CPU of a pytest run's whole process tree: pytest, its servers and CLI children, Playwright's driver and every
# Chromium process. /usr/bin/time -v misses the processes nobody waits for (Chromium's renderers, its GPU process:
# half of a browser test file's CPU); a cgroup v1 cpuacct group of the run's own counts them all. Needs root and
# /sys/fs/cgroup/cpuacct (as on the project's VM); the group is removed afterwards.
#
#   bench/test_cpu.sh [pytest arguments]     e.g. bench/test_cpu.sh -n 0 tests/web/test_glance_pages.py
#
# Prints: wall seconds, CPU seconds of the tree, the load average before and after, pytest's last line.
set -euo pipefail
group=/sys/fs/cgroup/cpuacct/tensor-debugger-test-cpu-$$
mkdir "$group"
trap 'rmdir "$group" 2>/dev/null || true' EXIT
log=$(mktemp)
load_before=$(cut -d' ' -f1 /proc/loadavg)
start=$(date +%s.%N)
status=0
bash -c "echo \$\$ > $group/cgroup.procs; exec .venv/bin/python -m pytest -q -p no:cacheprovider $*" >"$log" 2>&1 || status=$?
end=$(date +%s.%N)
cpu_ns=$(cat "$group/cpuacct.usage")
load_after=$(cut -d' ' -f1 /proc/loadavg)
python3 -c "print(f'wall {$end - $start:.1f} s, CPU of the process tree {$cpu_ns / 1e9:.1f} s, load {\"$load_before\"} -> {\"$load_after\"}')"
grep -E "passed|failed|error" "$log" | tail -1 || true
rm -f "$log"
exit $status
