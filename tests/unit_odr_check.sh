#!/bin/bash
# usage: unit_odr_check.sh <namespace regex> <objects...>
# The xsimd units (-msse4.2 / -mavx2 / -mavx512*) and the SVE units (-march=armv8.2-a+sve
# -msve-vector-bits=N) are compiled with their instruction set for the whole file. Any inline
# function they emit as a weak (COMDAT) symbol outside their own namespace could be the copy the
# linker keeps for the whole program, and then code compiled for AVX-512 (or 512-bit SVE) would
# run where the CPU check chose SSE4 (or NEON). This test lists such symbols; there must be none
# (the kernels' own code lives in the per-unit namespaces, everything else is inlined).
# Optimized builds only (see tests/CMakeLists.txt): at -O0 the compiler keeps even std::min out
# of line. core/inline.h is what keeps the core helpers the kernels call inside each unit.
set -euo pipefail
ns=$1
shift
nm=${NM:-nm}
bad=0
for obj in "$@"; do
  syms=$("$nm" -C --defined-only "$obj" | awk '$2 ~ /^[WVu]$/ && $2 != "V"' |
         grep -v "cpuattn::$ns::" || true)
  if [ -n "$syms" ]; then
    echo "$obj: weak symbols outside its namespace ($ns):"
    echo "$syms"
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "$# objects: no weak code symbols outside cpuattn::$ns"
exit "$bad"
