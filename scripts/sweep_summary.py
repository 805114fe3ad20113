#!/usr/bin/env python3
"""Summarises scripts/sweep.sh's CSVs (results/sweep_*.csv, results/alloc_*.csv)
as the Markdown tables of docs/quality.md: NLL increase per configuration,
model, protocol and budget; the configuration with the lowest summed
increase; the goal check of the chosen default; the budget allocators.
Usage: python3 scripts/sweep_summary.py [--default LABEL] [results-dir]"""
import csv
import math
import glob
import os
import sys
from collections import defaultdict

MODELS = ["stories260K", "tinystories656k", "babyllama105"]
GOAL_FRACTIONS = (0.0625, 0.125, 0.25, 0.5)  # the 6-50% of the context


def load(path):
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["policy"] != "full"]


NOMINAL = (0.03125, 0.0625, 0.125, 0.25, 0.5)  # the default --budgets


def frac_key(r):
    # B / length, rounded to whole tokens (31 / 500 = 6.2%): the nominal
    # percentage it was asked as.
    f = float(r["budget_fraction"])
    return min(NOMINAL, key=lambda n: abs(math.log(f / n)))


def pct(x):
    return f"+{100 * x:.1f}%" if x >= 0 else f"{100 * x:.1f}%"


def main():
    args = sys.argv[1:]
    default = "w25-norm"
    if "--default" in args:
        i = args.index("--default")
        default = args[i + 1]
        del args[i:i + 2]
    root = args[0] if args else "results"
    # cells[(model, protocol)][label][fraction] = relative increase
    cells = defaultdict(lambda: defaultdict(dict))
    budgets = {}
    for model in MODELS:
        rows = []
        for path in sorted(glob.glob(os.path.join(root, f"sweep_{model}.csv")) +
                           glob.glob(os.path.join(root, f"sweep_{model}_*.csv"))):
            rows += load(path)
        for r in rows:
            key = (model, r["protocol"])
            cells[key][r["policy"]][frac_key(r)] = float(r["relative_increase"])
            budgets[(model, frac_key(r))] = int(r["budget"])
    if not cells:
        sys.exit(f"no {root}/sweep_<model>.csv: run scripts/sweep.sh first")

    for (model, protocol), by_label in cells.items():
        fractions = sorted({f for row in by_label.values() for f in row})
        print(f"\n### {model}, {protocol}\n")
        print("| configuration | " + " | ".join(f"{100 * f:.3g}% (B={budgets[(model, f)]})" for f in fractions) + " |")
        print("|---|" + "---|" * len(fractions))
        for label, row in by_label.items():
            print(f"| {label} | " + " | ".join(pct(row[f]) if f in row else "—" for f in fractions) + " |")

    # The choice: lowest summed increase over the goal's cells that every
    # candidate ran (the w*-configurations of the unimportant count).
    candidates = sorted({l for by in cells.values() for l in by if l.startswith("w")})
    common = [(k, f) for k, by in cells.items() for f in GOAL_FRACTIONS
              if all(f in by.get(l, {}) for l in candidates)]
    totals = {l: sum(100 * cells[k][l][f] for k, f in common) for l in candidates}
    print(f"\n### Sum of NLL increase (points) over {len(common)} cells "
          f"(3 models x 2 protocols x budgets 6.25-50% that every configuration ran)\n")
    print("| configuration | sum | decode | prefill |")
    print("|---|---|---|---|")
    for l in sorted(totals, key=totals.get):
        dec = sum(100 * cells[k][l][f] for k, f in common if k[1] == "decode")
        pre = totals[l] - dec
        print(f"| {l} | {totals[l]:.1f} | {dec:.1f} | {pre:.1f} |")

    # Goal check of the default: beats random, streaming and h2o; within 0.5
    # points of the best configuration measured in that cell.
    print(f"\n### Goal check for {default}\n")
    print("| model | protocol | budget | default | best (configuration) | gap | beats random / streaming / h2o |")
    print("|---|---|---|---|---|---|---|")
    met = total = 0
    for (model, protocol), by in cells.items():
        for f in GOAL_FRACTIONS:
            if f not in by.get(default, {}):
                continue
            d = by[default][f]
            best_label = min((l for l in by if f in by[l]), key=lambda l: by[l][f])
            gap = 100 * (d - by[best_label][f])
            beats = all(d < by[b][f] for b in ("random", "streaming", "h2o") if f in by.get(b, {}))
            ok = beats and gap <= 0.5
            met += ok
            total += 1
            print(f"| {model} | {protocol} | {100 * f:.3g}% | {pct(d)} | {pct(by[best_label][f])} ({best_label}) | "
                  f"{gap:.1f} | {'yes' if beats else 'NO'} |")
    print(f"\n{met} of {total} cells meet the goal (beats the three baselines and within 0.5 points of the best).")

    # Allocators.
    alloc = defaultdict(lambda: defaultdict(dict))
    for path in sorted(glob.glob(os.path.join(root, "alloc_*.csv"))):
        base = os.path.basename(path)[len("alloc_"):-len(".csv")]
        model = next((m for m in MODELS if base.startswith(m + "_")), None)
        if model is None:
            continue
        name = base[len(model) + 1:]
        for r in load(path):
            alloc[(model, r["protocol"], r["policy"])][name][frac_key(r)] = float(r["relative_increase"])
    if alloc:
        order = ["uniform", "ramp", "pyramid", "persistence", "persistence-chance-min-age10",
                 "persistence-chance-min-fraction0.1"]
        print("\n### Budget split across layers (same total)\n")
        for (model, protocol, policy), by in sorted(alloc.items()):
            fractions = sorted({f for row in by.values() for f in row if f in GOAL_FRACTIONS})
            # Summed only where every allocator ran (a split that leaves a
            # layer at or below r is skipped at that budget).
            shared = [f for f in fractions if all(f in row for row in by.values())]
            print(f"\n{model}, {protocol}, {policy}:\n")
            print("| allocator | " + " | ".join(f"{100 * f:.3g}%" for f in fractions) + " | sum where all ran |")
            print("|---|" + "---|" * (len(fractions) + 1))
            for name in [n for n in order if n in by] + [n for n in by if n not in order]:
                row = by[name]
                s = sum(100 * row[f] for f in shared)
                print(f"| {name} | " + " | ".join(pct(row[f]) if f in row else "—" for f in fractions)
                      + f" | {s:.1f} |")


if __name__ == "__main__":
    main()
