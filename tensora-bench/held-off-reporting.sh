#!/bin/bash
# Run "$@" with this VM's free page reporting held off (the stand-in for a machine whose host does
# not take free memory back: docs/performance.md "Restarts"): page_reporting_order 11 reports no
# block, min_free_ms 300000; 60 % of MemAvailable faulted in and freed first so free blocks are
# backed; the settings restored on exit. Root only. This VM's kernel (Firecracker, 6.18-fc) has the
# min_free_ms, max_waiting_mib, passes and reported_kib knobs; upstream Linux has only the order.
P=/sys/module/page_reporting/parameters
set -u
if [ ! -w $P/page_reporting_order ]; then echo "no writable page_reporting here: running as is" >&2; exec "$@"; fi
o=$(cat $P/page_reporting_order); m=$(cat $P/min_free_ms 2>/dev/null || true); w=$(cat $P/max_waiting_mib 2>/dev/null || true)
trap 'echo $o > $P/page_reporting_order; [ -z "$m" ] || echo $m > $P/min_free_ms; [ -z "$w" ] || echo $w > $P/max_waiting_mib; echo "restored order $(cat $P/page_reporting_order) at $(date -u +%T)"' EXIT
echo 11 > $P/page_reporting_order; [ -z "$m" ] || echo 300000 > $P/min_free_ms
echo "held off at $(date -u +%T): reported_kib $(cat $P/reported_kib 2>/dev/null)"
python3 - <<'PY'
import mmap
n = int(next(l for l in open('/proc/meminfo') if l.startswith('MemAvailable')).split()[1]) * 1024 * 6 // 10 // 4096 * 4096
m = mmap.mmap(-1, n)
for i in range(0, n, 4096):
    m[i] = 1
m.close()
PY
echo "backed at $(date -u +%T)"
"$@"
echo "end: reported_kib $(cat $P/reported_kib 2>/dev/null)"
