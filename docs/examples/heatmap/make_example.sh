#!/usr/bin/env bash
# Builds the heatmap example of docs/api.md: the cross attention of a toy translation model,
# drawn by `cpuattn heatmap`. Writes docs/heatmap.png and docs/heatmap.svg in the repository.
#
# Usage: docs/examples/heatmap/make_example.sh [BUILD_DIR]     (default: build/release)
# Needs a built `cpuattn` (cmake --build BUILD_DIR --target cpuattn_cli) and python3 with numpy.
#
# The attention is made up, not learned: every English (source) token gets a random unit key
# vector (K = V), and each French (target) query is a sharp multiple of the key of the English
# token it translates, plus a little noise. So each French token attends mostly to its English
# counterpart, and the picture shows the word-order swap "zone économique européenne" <->
# "European Economic Area" as an anti-diagonal, and "a été" both attending to "was".
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
build=${1:-$repo/build/release}
if [[ ! -x "$build/tools/cpuattn" ]]; then
  echo "make_example.sh: no cpuattn binary in $build/tools; build it first:" >&2
  echo "  cmake --build $build --target cpuattn_cli" >&2
  exit 2
fi
cpuattn=$(cd "$build/tools" && pwd)/cpuattn

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$repo/docs"
cd "$work"

/usr/bin/python3 - <<'PY'
import numpy as np

en = "The agreement on the European Economic Area was signed in August 1992 . <end>".split()
fr = "L' accord sur la zone économique européenne a été signé en août 1992 . <end>".split()
# For each French token, the English token it translates.
align = {
    "L'": "The", "accord": "agreement", "sur": "on", "la": "the",
    "zone": "Area", "économique": "Economic", "européenne": "European",
    "a": "was", "été": "was", "signé": "signed", "en": "in", "août": "August",
    "1992": "1992", ".": ".", "<end>": "<end>",
}
assert len(en) == 14 and len(fr) == 15 and set(align) == set(fr)

rng = np.random.default_rng(1992)
D = 32
keys = rng.standard_normal((len(en), D))
keys /= np.linalg.norm(keys, axis=1, keepdims=True)
# Queries: a sharp multiple of the aligned key (the run's default scale is 1/sqrt(D)), plus noise.
sharpness = 24.0
q = np.stack([sharpness * keys[en.index(align[w])] for w in fr])
q += 1.5 * rng.standard_normal(q.shape)

np.save("q.npy", q.reshape(1, 1, len(fr), D).astype(np.float32))
np.save("k.npy", keys.reshape(1, 1, len(en), D).astype(np.float32))
with open("fr.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(fr) + "\n")
with open("en.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(en) + "\n")
PY

"$cpuattn" run --q q.npy --k k.npy --v k.npy --out out.npy --weights w.npy
"$cpuattn" heatmap --weights w.npy --out "$repo/docs/heatmap.png" \
  --row-labels fr.txt --col-labels en.txt
