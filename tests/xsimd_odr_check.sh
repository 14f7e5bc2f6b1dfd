#!/bin/bash
# The xsimd units are compiled with -msse4.2 / -mavx2 / -mavx512* for the whole file. Any inline
# function they emit as a weak (COMDAT) symbol outside their own namespace (cpuattn::xsimd_*)
# could be the copy the linker keeps for the whole program, and then code compiled for AVX-512
# would run where the CPU check chose SSE4. This test lists such symbols; there must be none
# (the kernels' own code lives in the per-architecture namespaces, everything else is inlined).
# Optimized builds only (see tests/CMakeLists.txt): at -O0 the compiler keeps even std::min out
# of line. core/inline.h is what keeps the core helpers the kernels call inside each unit.
set -euo pipefail
bad=0
for obj in "$@"; do
  syms=$(nm -C --defined-only "$obj" | awk '$2 ~ /^[WVu]$/ && $2 != "V"' |
         grep -v 'cpuattn::xsimd_\(sse4\|avx2\|avx512\)::' || true)
  if [ -n "$syms" ]; then
    echo "$obj: weak symbols outside its xsimd namespace:"
    echo "$syms"
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "$# xsimd objects: no weak code symbols outside their namespaces"
exit "$bad"
