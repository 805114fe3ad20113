#!/usr/bin/env python3
"""The tables, compounding check and plot of docs/quantization.md from the
evaluate CSVs scripts/quantization.sh writes (DIR/<model>_kv<bits>_g<group>.csv,
one per model, stored format and group of texts).

Every Δ is against the full fp32 cache on the same texts (each CSV's
nll_fp32); a group of texts is one replicate, so a Δ's standard error is the
spread of its per-group values over sqrt(groups). The compounding excess of
a format q and a budget B is ΔNLL(q + B) - ΔNLL(q) - ΔNLL(B), computed per
group (paired) and averaged.

Writes, beside DIR: quantization.csv, quantization_compounding.csv,
quantization_tables.md and quantization_nll.png (gnuplot).
Usage: quantization_summary.py [DIR]   (default results/quantization)"""
import csv
import glob
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

MODELS = ["stories260K", "tinystories656k", "babyllama105"]
FORMAT_NAMES = {32: "fp32", 16: "bf16", 8: "int8", 4: "int4"}


def fmt_name(bits, group):
    name = FORMAT_NAMES[bits]
    return f"{name}/g{group}" if bits in (8, 4) else name


def mean_se(values):
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return m, se


def load(directory):
    """Cells keyed by (model, protocol, bits, policy, budget): per group the
    NLL and its fp32 reference, and the bytes (the same in every group)."""
    cells = {}
    files = sorted(glob.glob(os.path.join(directory, "*_kv*_g*.csv")))
    if not files:
        sys.exit(f"quantization_summary.py: no *_kv<bits>_g<group>.csv under {directory} (run scripts/quantization.sh)")
    for path in files:
        group = int(re.search(r"_g(\d+)\.csv$", path).group(1))
        for r in csv.DictReader(open(path, newline="")):
            bits = int(r["kv_bits"])
            key = (r["model"], r["protocol"], bits, r["policy"], int(r["budget"]))
            c = cells.setdefault(key, {"groups": {}, "group_size": int(r["kv_group"])})
            c["groups"][group] = (float(r["nll"]), float(r["nll_fp32"]), int(r["predictions"]))
            for name in ("kv_kib", "kv_param_kib", "state_kib", "total_kib", "state_slot_kib", "budget_fraction"):
                c[name] = float(r[name])
    return cells


def summarise(cells):
    rows = []
    for (model, protocol, bits, policy, budget), c in cells.items():
        groups = sorted(c["groups"])
        nll = sum(c["groups"][g][0] * c["groups"][g][2] for g in groups) / sum(c["groups"][g][2] for g in groups)
        delta, se = mean_se([c["groups"][g][0] - c["groups"][g][1] for g in groups])
        rows.append(dict(model=model, protocol=protocol, kv_bits=bits, kv_group=c["group_size"], policy=policy,
                         budget=budget, budget_fraction=c["budget_fraction"], kv_kib=c["kv_kib"],
                         kv_param_kib=c["kv_param_kib"], state_kib=c["state_kib"], total_kib=c["total_kib"],
                         state_slot_kib=c["state_slot_kib"], groups=len(groups), nll=nll, delta_nll=delta,
                         delta_se=se, _per_group={g: c["groups"][g][0] - c["groups"][g][1] for g in groups}))
    # Memory as a fraction of the full fp32 cache, and the frontier: no other
    # configuration holds at most as much memory with a lower NLL.
    for model, protocol in {(r["model"], r["protocol"]) for r in rows}:
        here = [r for r in rows if r["model"] == model and r["protocol"] == protocol]
        full = next((r for r in here if r["kv_bits"] == 32 and r["policy"] == "full"), None)
        for r in here:
            r["total_fraction"] = r["total_kib"] / full["total_kib"] if full else float("nan")
            r["frontier"] = not any(o is not r and o["total_kib"] <= r["total_kib"] and o["nll"] < r["nll"]
                                    for o in here)
    order = {m: i for i, m in enumerate(MODELS)}
    rows.sort(key=lambda r: (order.get(r["model"], 99), r["model"], r["protocol"], -r["total_kib"]))
    return rows


def compounding(rows):
    index = {(r["model"], r["protocol"], r["kv_bits"], r["policy"], r["budget"]): r for r in rows}
    out = []
    for r in rows:
        if r["kv_bits"] == 32 or r["policy"] == "full":
            continue
        quant = index.get((r["model"], r["protocol"], r["kv_bits"], "full", 0))
        evict = index.get((r["model"], r["protocol"], 32, r["policy"], r["budget"]))
        if not quant or not evict:
            continue
        groups = sorted(set(r["_per_group"]) & set(quant["_per_group"]) & set(evict["_per_group"]))
        excess, se = mean_se([r["_per_group"][g] - quant["_per_group"][g] - evict["_per_group"][g] for g in groups])
        additive = quant["delta_nll"] + evict["delta_nll"]
        if excess > 2 * se:
            verdict = "compounds"
        elif excess < -2 * se:
            verdict = "sub-additive"
        else:
            verdict = "additive"
        out.append(dict(model=r["model"], protocol=r["protocol"], policy=r["policy"], kv_bits=r["kv_bits"],
                        kv_group=r["kv_group"], budget=r["budget"], budget_fraction=r["budget_fraction"],
                        delta_quant=quant["delta_nll"], delta_evict=evict["delta_nll"], sum=additive,
                        delta_both=r["delta_nll"], excess=excess, excess_se=se,
                        excess_of_sum=excess / additive if additive > 0 else float("nan"), verdict=verdict,
                        groups=len(groups)))
    return out


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})


def config_name(r):
    name = fmt_name(r["kv_bits"], r["kv_group"])
    if r["policy"] == "full":
        return f"{name}, full cache"
    return f"{name} + {r['policy']} B={r['budget']} ({100 * r['budget_fraction']:.3g}%)"


def tables(rows, comp):
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for protocol in dict.fromkeys(r["protocol"] for r in rows if r["model"] == model):
            here = [r for r in rows if r["model"] == model and r["protocol"] == protocol]
            full = next(r for r in here if r["kv_bits"] == 32 and r["policy"] == "full")
            lines.append(f"#### {model} ({protocol}; full fp32 cache: NLL {full['nll']:.4f}, "
                         f"{full['total_kib']:.1f} KiB, {full['groups']} groups of texts)\n")
            lines.append("| configuration | K/V KiB | params KiB | state KiB | total KiB | % of fp32 | NLL | ΔNLL ± SE | frontier |")
            lines.append("|---|---:|---:|---:|---:|---:|---:|---:|:-:|")
            for r in here:
                se = "" if math.isnan(r["delta_se"]) else f" ± {r['delta_se']:.4f}"
                lines.append(f"| {config_name(r)} | {r['kv_kib']:.1f} | {r['kv_param_kib']:.1f} | {r['state_kib']:.1f} | "
                             f"{r['total_kib']:.1f} | {100 * r['total_fraction']:.1f}% | {r['nll']:.4f} | "
                             f"{r['delta_nll']:+.4f}{se} | {'★' if r['frontier'] else ''} |")
            lines.append("")
            mine = [c for c in comp if c["model"] == model and c["protocol"] == protocol]
            if mine:
                lines.append(f"Compounding ({model}, {protocol}): excess = ΔNLL(both) − ΔNLL(quant) − ΔNLL(evict), "
                             "paired over the groups of texts; ± one standard error.\n")
                lines.append("| format | policy | budget | ΔNLL quant | ΔNLL evict | sum | ΔNLL both | excess ± SE | excess / sum | verdict |")
                lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
                for c in sorted(mine, key=lambda c: (-c["kv_bits"], c["policy"], c["budget"])):
                    ratio = "" if math.isnan(c["excess_of_sum"]) else f"{100 * c['excess_of_sum']:+.0f}%"
                    lines.append(f"| {fmt_name(c['kv_bits'], c['kv_group'])} | {c['policy']} | {c['budget']} "
                                 f"({100 * c['budget_fraction']:.3g}%) | {c['delta_quant']:+.4f} | {c['delta_evict']:+.4f} | "
                                 f"{c['sum']:+.4f} | {c['delta_both']:+.4f} | {c['excess']:+.4f} ± {c['excess_se']:.4f} | "
                                 f"{ratio} | {c['verdict']} |")
                lines.append("")
    # One line per format over every model and budget.
    if comp:
        lines.append("#### Compounding, all models and budgets\n")
        lines.append("| format | cells | additive | compounds | sub-additive | largest excess (nats) |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for bits in sorted({c["kv_bits"] for c in comp}, reverse=True):
            mine = [c for c in comp if c["kv_bits"] == bits]
            count = {v: sum(c["verdict"] == v for c in mine) for v in ("additive", "compounds", "sub-additive")}
            worst = max(mine, key=lambda c: c["excess"])
            lines.append(f"| {FORMAT_NAMES[bits]} | {len(mine)} | {count['additive']} | {count['compounds']} | "
                         f"{count['sub-additive']} | {worst['excess']:+.4f} ({worst['model']}, B={worst['budget']}) |")
        lines.append("")
    return "\n".join(lines)


def plot(rows, png):
    if not shutil.which("gnuplot"):
        print("quantization_summary.py: gnuplot not found; no plot (bash scripts/setup.sh installs it)", file=sys.stderr)
        return
    panels = [(m, p) for m in dict.fromkeys(r["model"] for r in rows)
              for p in dict.fromkeys(r["protocol"] for r in rows if r["model"] == m)]
    work = tempfile.mkdtemp()
    script = []
    low = 0.8 * min(100 * r["total_fraction"] for r in rows)
    for i, (model, protocol) in enumerate(panels):
        here = [r for r in rows if r["model"] == model and r["protocol"] == protocol]
        full = next(r for r in here if r["kv_bits"] == 32 and r["policy"] == "full")
        series = []
        # (a) quantization alone: the full cache in every format.
        quant = sorted((r for r in here if r["policy"] == "full"), key=lambda r: -r["kv_bits"])
        path = os.path.join(work, f"p{i}_quant.dat")
        with open(path, "w") as f:
            for r in quant:
                f.write(f"{100 * r['total_fraction']:.4f} {r['nll']:.6f} {fmt_name(r['kv_bits'], r['kv_group'])}\n")
        series.append(f"'{path}' using 1:2 with linespoints lw 2 pt 7 ps 1.3 lc rgb 'black' title 'quantization alone (full cache)', "
                      f"'{path}' using 1:2:3 with labels rotate by 35 offset 0.4,0.6 left font ',8' notitle")
        # (b) eviction alone and (c) both: one line per format and policy.
        colours = {32: "#1f77b4", 16: "#2ca02c", 8: "#ff7f0e", 4: "#d62728"}
        points = {32: 5, 16: 9, 8: 11, 4: 13}
        for policy in dict.fromkeys(r["policy"] for r in here if r["policy"] != "full"):
            for bits in sorted({r["kv_bits"] for r in here}, reverse=True):
                # From the format's full cache (no eviction) down the budgets.
                line = sorted((r for r in here if r["kv_bits"] == bits and r["policy"] in (policy, "full")),
                              key=lambda r: r["total_kib"])
                if not line:
                    continue
                path = os.path.join(work, f"p{i}_{policy}_{bits}.dat")
                with open(path, "w") as f:
                    for r in line:
                        f.write(f"{100 * r['total_fraction']:.4f} {r['nll']:.6f}\n")
                what = "eviction alone (fp32)" if bits == 32 else f"{fmt_name(bits, line[0]['kv_group'])} + eviction"
                dash = 1 if policy == "scissorhands" else 2
                series.append(f"'{path}' using 1:2 with linespoints lw 2 pt {points[bits]} dt {dash} "
                              f"lc rgb '{colours[bits]}' title '{what} ({policy})'")
        series.append(f"{full['nll']:.6f} with lines dt 2 lc rgb 'gray40' title 'full fp32 cache ({full['nll']:.3f})'")
        title = model if len({p for _, p in panels}) == 1 else f"{model} ({protocol})"
        script.append(f'set title "{title}: NLL against total KV memory"')
        script.append("plot " + ", \\\n     ".join(series))
    header = [
        f"set terminal pngcairo size {560 * len(panels) + 40},560 font 'sans,9'",
        f"set output '{png}'",
        f"set multiplot layout 1,{len(panels)} title "
        "\"KV quantization composed with eviction (teacher-forced NLL; lower is better; memory = K/V + parameters + state)\"",
        "set logscale x 2",
        f"set xrange [{low:.3g}:150]",
        "set xtics (0.78125, 1.5625, 3.125, 6.25, 12.5, 25, 50, 100)",
        'set xlabel "total KV memory held (% of the full fp32 cache, log scale)"',
        'set ylabel "mean NLL (nats / token)"',
        "set grid",
        "set key top right font ',8'",
    ]
    gp = os.path.join(work, "plot.gp")
    with open(gp, "w") as f:
        f.write("\n".join(header + script + ["unset multiplot"]) + "\n")
    subprocess.run(["gnuplot", gp], check=True)
    shutil.rmtree(work)
    print(f"quantization_summary.py: wrote {png}")


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "results/quantization"
    parent = os.path.dirname(os.path.abspath(directory))
    rows = summarise(load(directory))
    comp = compounding(rows)
    write_csv(os.path.join(parent, "quantization.csv"), rows,
              ["model", "protocol", "kv_bits", "kv_group", "policy", "budget", "budget_fraction", "kv_kib",
               "kv_param_kib", "state_kib", "total_kib", "total_fraction", "state_slot_kib", "groups", "nll",
               "delta_nll", "delta_se", "frontier"])
    write_csv(os.path.join(parent, "quantization_compounding.csv"), comp,
              ["model", "protocol", "policy", "kv_bits", "kv_group", "budget", "budget_fraction", "delta_quant",
               "delta_evict", "sum", "delta_both", "excess", "excess_se", "excess_of_sum", "verdict", "groups"])
    text = tables(rows, comp)
    with open(os.path.join(parent, "quantization_tables.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    plot(rows, os.path.join(parent, "quantization_nll.png"))


if __name__ == "__main__":
    main()
