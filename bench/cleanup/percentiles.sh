#!/usr/bin/env bash
# percentiles.sh LOGFILE... : "count p50_ms p99_ms" of the latencies (3rd field, us) in
# pgbench per-transaction logs (-l).
cat "$@" | awk '{print $3}' | sort -n | awk '
  { v[NR] = $1 }
  END {
    if (NR == 0) { print "0 nan nan"; exit }
    i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
    i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
    printf "%d %.3f %.3f\n", NR, v[i50] / 1000, v[i99] / 1000
  }'
