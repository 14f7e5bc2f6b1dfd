#!/usr/bin/python3
"""Draws what `cpuattn bench --json` prints.

    tools/plot_bench.py IN.json [IN.json ...] -o OUT.png [--title TEXT]

Each IN file holds JSON lines (one record per line). Per kind of record, one row of charts:
  --sweep seq      GFLOP/s and % of FMA peak against sequence length (log scale)
  --sweep batch    GFLOP/s and % of FMA peak against batch size
  --sweep threads  speed-up against threads with the ideal line, and the FMA probe's speed-up
                   around each point, dotted (below the ideal line when a core was shared while
                   that point ran); parallel efficiency beside it
  no sweep         GFLOP/s per shape, as bars
One series per input file, shape, provider, dtype, target, plan tweak (`--tweak`), threads or
version, whichever of these differ between the records (the legend names only what differs).

Run it with /usr/bin/python3: that interpreter sees Debian's python3-matplotlib.
"""
import argparse
import json
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES_KEYS = ("file", "shape", "simd", "dtype", "target", "tweak", "threads", "version",
               "causal")


def load(paths):
    records = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"plot_bench: {path}:{n}: not a JSON line ({e})")
                if "gflops" not in r:
                    sys.exit(f"plot_bench: {path}:{n}: not a `cpuattn bench --json` record")
                r["file"] = path
                records.append(r)
    if not records:
        sys.exit("plot_bench: no records in " + ", ".join(paths))
    return records


def series(records, skip=()):
    """Groups records by the series keys that vary among them; returns {label: [records]}."""
    keys = [k for k in SERIES_KEYS if k not in skip and len({str(r.get(k)) for r in records}) > 1]
    # The file names only matter when nothing else tells the series apart.
    others = [k for k in keys if k != "file"]
    if "file" in keys and others and len({tuple(str(r.get(k)) for k in others)
                                          for r in records}) == len(
            {tuple(str(r.get(k)) for k in keys) for r in records}):
        keys = others

    def part(r, k):
        if k == "causal":
            return "causal" if r.get(k) else "not causal"
        if k in ("file", "shape", "simd", "dtype", "target", "tweak"):
            return str(r.get(k))
        return f"{k} {r.get(k)}"

    groups = OrderedDict()
    for r in records:
        label = ", ".join(part(r, k) for k in keys) or r.get("shape", "")
        groups.setdefault(label, []).append(r)
    return groups


def machine_line(records):
    m = records[0].get("machine", {})
    rev = records[0].get("revision", "?")
    return f"{m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs; cpuattn {rev}"


def plot_rate(ax_rate, ax_pct, recs, xlabel, logx):
    for label, rs in series(recs).items():
        rs = sorted(rs, key=lambda r: r["value"])
        xs = [r["value"] for r in rs]
        ax_rate.plot(xs, [r["gflops"] for r in rs], marker="o", label=label)
        ax_pct.plot(xs, [r["pct_peak"] for r in rs], marker="o", label=label)
    for ax, ylabel in ((ax_rate, "GFLOP/s"), (ax_pct, "% of FMA peak")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_pct.set_ylim(0, 100)
    ax_rate.legend(fontsize=8)


def plot_threads(ax_sp, ax_eff, recs):
    top = max(r["threads"] for r in recs)
    ax_sp.plot([1, top], [1, top], "k--", linewidth=1, label="ideal")
    ts = sorted({r["threads"] for r in recs})
    for label, rs in series(recs, skip=("threads",)).items():
        rs = sorted(rs, key=lambda r: r["threads"])
        xs = [r["threads"] for r in rs]
        line, = ax_sp.plot(xs, [r["speedup"] for r in rs], marker="o", label=label)
        ax_eff.plot(xs, [100 * r["efficiency"] for r in rs], marker="o", label=label)
        # The FMA probe run around each point: dotted, in the series' colour. It falls below the
        # ideal line where a neighbour shared a core while that point ran.
        ax_sp.plot(xs, [r.get("fma_speedup", 0) for r in rs], ":", color=line.get_color(),
                   marker="x")
    ax_sp.plot([], [], ":", color="grey", marker="x", label="FMA probe at that point")
    ax_sp.set_xlabel("threads")
    ax_sp.set_ylabel("speed-up over 1 thread")
    ax_eff.set_xlabel("threads")
    ax_eff.set_ylabel("parallel efficiency, %")
    ax_eff.set_ylim(0, 110)
    for ax in (ax_sp, ax_eff):
        ax.set_xticks(ts)
        ax.grid(True, alpha=0.3)
    ax_sp.legend(fontsize=8)


def plot_bars(ax_rate, ax_pct, recs):
    groups = series(recs, skip=("shape",))
    shapes = list(OrderedDict.fromkeys(r["shape"] for r in recs))
    width = 0.8 / max(1, len(groups))
    for gi, (label, rs) in enumerate(groups.items()):
        by_shape = {r["shape"]: r for r in rs}
        xs = [i + gi * width for i, s in enumerate(shapes) if s in by_shape]
        ax_rate.bar(xs, [by_shape[s]["gflops"] for s in shapes if s in by_shape], width,
                    label=label)
        ax_pct.bar(xs, [by_shape[s]["pct_peak"] for s in shapes if s in by_shape], width,
                   label=label)
    for ax, ylabel in ((ax_rate, "GFLOP/s"), (ax_pct, "% of FMA peak")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
        ax.set_xticklabels(shapes)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    ax_pct.set_ylim(0, 100)
    ax_rate.legend(fontsize=8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="files of `cpuattn bench --json` lines")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    records = load(args.inputs)
    kinds = list(OrderedDict.fromkeys(r.get("sweep", "") for r in records))
    fig, axes = plt.subplots(len(kinds), 2, figsize=(11, 4.2 * len(kinds)), squeeze=False)
    for row, kind in zip(axes, kinds):
        recs = [r for r in records if r.get("sweep", "") == kind]
        if kind == "seq":
            plot_rate(row[0], row[1], recs, "sequence length (Lk; Lq = Lk unless decode)", True)
            row[0].set_title("Sequence length: " + recs[0]["dims"].split(" Lq")[0])
        elif kind == "batch":
            plot_rate(row[0], row[1], recs, "batch size B", True)
            row[0].set_title("Batch size")
        elif kind == "threads":
            plot_threads(row[0], row[1], recs)
            row[0].set_title("Strong scaling")
        else:
            plot_bars(row[0], row[1], recs)
            row[0].set_title("Named shapes")
    fig.suptitle(args.title or machine_line(records), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_bench: wrote {args.output} ({len(records)} records)")


if __name__ == "__main__":
    main()
