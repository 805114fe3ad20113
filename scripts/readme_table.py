#!/usr/bin/env python3
"""The quality tables from scripts/main.sh's results/llama_nll.csv.
Default: the README's (per protocol, the NLL increase over the full cache of
each policy at 6.25, 12.5 and 25% of the text, per model). --docs: the
per-model tables of docs/llama.md (every budget, NLL and increase, the best
of each column in bold). Usage: readme_table.py [--docs] [CSV]"""
import csv
import math
import sys

MODELS = ["stories260K", "tinystories656k", "babyllama105"]
FRACTIONS = (0.0625, 0.125, 0.25)
NAMES = {
    "scissorhands": "scissorhands (default)",
    "scissorhands-paper": "scissorhands-paper (w=400, raw)",
    "scissorhands-important": "important count",
    "h2o-norm": "h2o, normalised",
    "snapkv": "snapkv (pool 5, mean)",
    "streaming": "streaming (4 sinks)",
}
NOMINAL = (0.03125, 0.0625, 0.125, 0.25, 0.5)


def nominal(f):
    return min(NOMINAL, key=lambda n: abs(math.log(f / n)))


def docs_tables(path):
    rows = list(csv.DictReader(open(path, newline="")))
    for model in MODELS:
        mine = [r for r in rows if r["model"] == model]
        if not mine:
            continue
        for protocol in dict.fromkeys(r["protocol"] for r in mine):
            here = [r for r in mine if r["protocol"] == protocol]
            full = next(r for r in here if r["policy"] == "full")
            runs = [r for r in here if r["policy"] != "full"]
            budgets = sorted({int(r["budget"]) for r in runs})
            length = {int(r["budget"]): float(r["budget_fraction"]) for r in runs}
            name = "Decode" if protocol == "decode" else f"Prefill ({protocol})"
            print(f"\n{model}: {name} — full cache **{float(full['nll']):.4f}** ({full['predictions']} predictions):\n")
            print("| policy | " + " | ".join(f"B={b} ({100 * length[b]:.3g}%)" for b in budgets) + " |")
            print("|---|" + "---|" * len(budgets))
            best = {b: min(float(r["nll"]) for r in runs if int(r["budget"]) == b) for b in budgets}
            for policy in dict.fromkeys(r["policy"] for r in runs):
                cells = []
                for b in budgets:
                    r = next((x for x in runs if x["policy"] == policy and int(x["budget"]) == b), None)
                    if r is None:
                        cells.append("—")
                        continue
                    text = f"{float(r['nll']):.4f} (+{100 * float(r['relative_increase']):.1f}%)"
                    cells.append(f"**{text}**" if float(r["nll"]) == best[b] else text)
                print(f"| {policy} | " + " | ".join(cells) + " |")


def main():
    args = sys.argv[1:]
    if args and args[0] == "--docs":
        docs_tables(args[1] if len(args) > 1 else "results/llama_nll.csv")
        return
    path = args[0] if args else "results/llama_nll.csv"
    cells, order, protocols = {}, [], []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["policy"] == "full":
                continue
            kind = r["protocol"].split(":")[0]
            if kind not in protocols:
                protocols.append(kind)
            if r["policy"] not in order:
                order.append(r["policy"])
            cells[(kind, r["policy"], r["model"], nominal(float(r["budget_fraction"])))] = float(r["relative_increase"])
    models = [m for m in MODELS if any(k[2] == m for k in cells)]
    for kind in protocols:
        what = "decode protocol" if kind == "decode" else "prefill protocol (half the text prefilled, compressed once)"
        print(f"\n{what}:\n")
        print("| policy | " + " | ".join(f"{m} {100 * x:g}%" for m in models for x in FRACTIONS) + " |")
        print("|---|" + "---|" * (len(models) * len(FRACTIONS)))
        for p in order:
            row = [cells.get((kind, p, m, x)) for m in models for x in FRACTIONS]
            print(f"| {NAMES.get(p, p)} | " + " | ".join("—" if v is None else f"+{100 * v:.1f}%" for v in row) + " |")


if __name__ == "__main__":
    main()
