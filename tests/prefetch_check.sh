#!/bin/bash
# Every kernel target's code (the functions of one cpuattn::<target> namespace: RunTask and what
# it did not inline) must still contain the prefetch of the K/V rows two blocks ahead
# (PrefetchKV, the only prefetcht1 the kernels issue). GCC 12 deleted __builtin_prefetch loops
# there without a word (lib/simd/prefetch.h), and no result changes when a prefetch is lost, so
# only the instructions can tell. x86-64 only; skipped without objdump.
set -euo pipefail
lib=$1
if [ "$(uname -m)" != x86_64 ] || ! command -v objdump > /dev/null; then
  echo "skipped: needs x86-64 and objdump"
  exit 0
fi
objdump -d --no-show-raw-insn -C "$lib" | awk '
  /^[0-9a-f]+ <.*>:$/ {
    ns = ""
    if (match($0, /cpuattn::[A-Za-z0-9_]+::/)) ns = substr($0, RSTART, RLENGTH)
    if (ns != "" && $0 ~ /::RunTask</) task[ns] = 1
    next
  }
  ns != "" && /prefetcht1/ { prefetch[ns] = 1 }
  END {
    n = 0; bad = 0
    for (t in task) { n++; if (!(t in prefetch)) { print "no prefetcht1 in " t "*"; bad++ } }
    if (n == 0) { print "no RunTask found in the library"; exit 1 }
    printf "%d kernel targets, %d without the PrefetchKV prefetch\n", n, bad
    exit (bad > 0 ? 1 : 0)
  }'
