#!/usr/bin/env python3
"""Tables for docs/quality.md from scissorhands_llamacpp's CSVs (Gemma 3 270M
through llama.cpp; scripts/gemma_quality.sh runs them).

    gemma_summary.py [--out-csv DIR] [--tiny docs/quality.md] [--default NAME]
                     [--persistence CSV ...] [--texts CSV ...] RUN [RUN ...]

A RUN is one evaluate CSV, or several joined by '+': the same cells measured
on disjoint sets of texts of equal length, pooled exactly (NLL sums weighted
by predictions, the full cache's too). Runs of one protocol are merged; a
cell measured twice is an error. Prints, per protocol, the NLL increase
table, the goal checked cell by cell (the default against every baseline
and within 0.5 points of the best configuration), and the compression
(text / budget) each policy reaches at <= 1% and <= 0.5% NLL increase; with
--tiny, one table of those compressions on the three tiny models too, parsed
from the per-model tables of docs/quality.md. --out-csv writes the merged cells,
one CSV per protocol (what scripts/llama_cpp_plot.py draws). With --texts
(evaluate --texts-csv files), each of the default's margins over a baseline
comes with a 95% paired bootstrap interval over the texts: how far another
draw of texts like these could move it.
"""
import argparse
import csv
import random
import re
import sys
from collections import OrderedDict

BASELINES = ["streaming", "h2o", "tova", "context-shift", "random"]


def pooled(paths):
    """One run: cells keyed (protocol, policy, budget) -> dict, pooled over the files."""
    cells, full = OrderedDict(), {}
    for path in paths:
        rows = list(csv.DictReader(open(path)))
        for r in rows:
            key = (r["protocol"], r["policy"], r["budget"])
            nll_sum = float(r["nll"]) * int(r["predictions"])
            full_sum = float(r["nll_full"]) * int(r["predictions"])
            c = cells.setdefault(key, {"nll_sum": 0.0, "full_sum": 0.0, "predictions": 0, "texts": 0, "files": 0,
                                       "budget_tokens": r["budget_tokens"], "peak": 0, "seconds": 0.0})
            c["nll_sum"] += nll_sum
            c["full_sum"] += full_sum
            c["predictions"] += int(r["predictions"])
            c["texts"] += int(r["texts"])
            c["files"] += 1
            c["peak"] = max(c["peak"], int(r["peak_cells"]))
            c["seconds"] += float(r["seconds"])
    # A cell missing from one of the files is not pooled over the same texts.
    return OrderedDict((k, c) for k, c in cells.items() if c["files"] == len(paths))


def merge(runs):
    merged = OrderedDict()
    for run in runs:
        for key, c in pooled(run.split("+")).items():
            if key in merged and key[1] != "full":
                sys.exit(f"cell {key} measured in two runs")
            if key[1] == "full" and key in merged:
                if abs(merged[key]["nll_sum"] / merged[key]["predictions"] - c["nll_sum"] / c["predictions"]) > 1e-5:
                    sys.exit(f"two runs disagree on the full cache of {key[0]}: not the same texts")
                continue
            merged[key] = c
    return merged


def increase(c):
    return 100.0 * (c["nll_sum"] / c["full_sum"] - 1.0)


def budgets_of(cells, protocol):
    seen = []
    for (p, policy, b) in cells:
        if p == protocol and policy != "full" and b not in seen:
            seen.append(b)
    return sorted(seen, key=pct)


def table(cells, protocol):
    budgets = budgets_of(cells, protocol)
    policies = [k[1] for k in cells if k[0] == protocol and k[1] != "full"]
    policies = list(OrderedDict.fromkeys(policies))
    full = cells[(protocol, "full", "100%")]
    texts = full["texts"]
    out = [f"Full cache NLL {full['nll_sum'] / full['predictions']:.4f} over {full['predictions']} predictions "
           f"({texts} texts).", "", "| policy | " + " | ".join(budgets) + " |",
           "|---|" + "---|" * len(budgets)]
    best = {b: min((increase(c), k[1]) for k, c in cells.items() if k[0] == protocol and k[2] == b and k[1] != "full")
            for b in budgets}
    for policy in policies:
        row = []
        for b in budgets:
            c = cells.get((protocol, policy, b))
            if c is None:
                row.append("—")
                continue
            v = increase(c)
            row.append(f"**{v:+.2f}%**" if best[b][1] == policy else f"{v:+.2f}%")
        out.append(f"| {policy} | " + " | ".join(row) + " |")
    return "\n".join(out), policies, budgets


def per_text(paths):
    """evaluate --texts-csv files -> {(protocol, policy, budget): {text: (nll_sum, full_sum)}}."""
    out = {}
    for path in paths:
        for r in csv.DictReader(open(path)):
            key = (r["protocol"], r["policy"], r["budget"])
            value = (float(r["nll_sum"]), float(r["nll_full_sum"]))
            texts = out.setdefault(key, {})
            if r["text"] in texts and (key[1] != "full" or abs(texts[r["text"]][0] - value[0]) > 1e-3):
                sys.exit(f"text {r['text']} of cell {key} measured twice" +
                         (" with different full caches" if key[1] == "full" else ""))
            texts[r["text"]] = value
    return out


def paired_interval(a, b, resamples=10000, seed=1):
    """a, b: {text: (nll_sum, full_sum)} over the same texts. The pooled
    increase of a minus that of b, in points, and its 95% percentile
    bootstrap interval (texts drawn with replacement, the pair kept)."""
    if set(a) != set(b):
        sys.exit("paired cells are not over the same texts")
    names = sorted(a)
    rows = [(a[t][0] - b[t][0], a[t][1]) for t in names]
    def diff(sample):
        return 100.0 * sum(d for d, _ in sample) / sum(f for _, f in sample)
    rng = random.Random(seed)
    draws = sorted(diff([rows[rng.randrange(len(rows))] for _ in rows]) for _ in range(resamples))
    return diff(rows), draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]


def margins(texts, protocol, default, budgets):
    """The default minus each baseline, per budget, with paired intervals."""
    out = ["| budget | " + " | ".join(BASELINES) + " |", "|---|" + "---|" * len(BASELINES)]
    counts = {"worse": 0, "better": 0, "open": 0}
    for b in budgets:
        d = texts.get((protocol, default, b))
        if d is None:
            continue
        row = []
        for base in BASELINES:
            t = texts.get((protocol, base, b))
            if t is None:
                row.append("—")
                continue
            m, lo, hi = paired_interval(d, t)
            counts["worse" if lo > 0 else "better" if hi < 0 else "open"] += 1
            row.append(f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]")
        out.append(f"| {b} | " + " | ".join(row) + " |")
    out.append("")
    out.append(f"Of {sum(counts.values())} margins, the interval lies below 0 (the default better) at "
               f"{counts['better']}, above 0 (the baseline better) at {counts['worse']}, and spans 0 at "
               f"{counts['open']}.")
    return "\n".join(out)


def goal(cells, protocol, default, budgets):
    out = ["| budget | default | best (configuration) | gap | beats " + " / ".join(BASELINES) + " | met |",
           "|---|---|---|---|---|---|"]
    met = 0
    total = 0
    for b in budgets:
        d = cells.get((protocol, default, b))
        if d is None:
            continue
        total += 1
        dv = increase(d)
        bv, bp = min((increase(c), k[1]) for k, c in cells.items() if k[0] == protocol and k[2] == b and k[1] != "full")
        beats = []
        for base in BASELINES:
            c = cells.get((protocol, base, b))
            if c is not None:
                beats.append("yes" if dv < increase(c) else f"NO ({increase(c):+.2f}%)")
            else:
                beats.append("—")
        ok = dv - bv <= 0.5 and all(x in ("yes", "—") for x in beats)
        met += ok
        out.append(f"| {b} | {dv:+.2f}% | {bv:+.2f}% ({bp}) | {dv - bv:.2f} | " + " / ".join(beats) +
                   f" | {'yes' if ok else 'NO'} |")
    out.append("")
    out.append(f"{met} of {total} cells meet the goal.")
    return "\n".join(out)


def pct(budget):
    return float(budget.rstrip("%"))


def reach(values, budgets, limit):
    """The largest compression (text / budget) whose budget and every larger
    measured budget stay within `limit`; None when even the largest fails."""
    good = None
    for b in sorted([b for b in budgets if b in values], key=pct, reverse=True):
        if values[b] > limit:
            break
        good = b
    return good


def compression(rows, budgets):
    """rows: policy -> {budget: increase}. The largest compression (text / budget)
    whose budget, and every larger budget measured, stays within the limit."""
    out = ["| policy | within 1% | within 0.5% |", "|---|---|---|"]
    for policy, values in rows.items():
        cols = []
        for limit in (1.0, 0.5):
            good = reach(values, budgets, limit)
            largest = max((b for b in budgets if b in values), key=pct)
            cols.append(f"{100.0 / pct(good):.3g}× ({good}: {values[good]:+.2f}%)" if good else
                        f"none (at {largest}: {values[largest]:+.2f}%)")
        out.append(f"| {policy} | " + " | ".join(cols) + " |")
    return "\n".join(out)


# The same policies under the two programs' names (examples/llama's sweep: tiny models).
HEADLINE = [("default", "scissorhands", "w25-norm-a2"), ("paper", "scissorhands-paper", "w400-raw"),
            ("H2O", "h2o", "h2o"), ("TOVA", "tova", "tova"), ("SnapKV", "snapkv", "snapkv"),
            ("StreamingLLM", "streaming", "streaming"), ("random", "random", "random")]


def headline(groups):
    """groups: [(model, protocol, {policy: {budget: increase}}, budgets, gemma)] -> one table."""
    out = ["| model | protocol | " + " | ".join(h[0] for h in HEADLINE) + " |",
           "|---|---|" + "---|" * len(HEADLINE)]
    for model, protocol, rows, budgets, gemma in groups:
        cols = []
        for _, gemma_name, tiny_name in HEADLINE:
            values = rows.get(gemma_name if gemma else tiny_name)
            if values is None:
                cols.append("—")
                continue
            one, half = reach(values, budgets, 1.0), reach(values, budgets, 0.5)
            fmt = lambda b: f"{100.0 / pct(b):.3g}×" if b else "<" + f"{100.0 / max(pct(x) for x in budgets):.3g}×"
            cols.append(f"{fmt(one)} / {fmt(half)}")
        out.append(f"| {model} | {protocol} | " + " | ".join(cols) + " |")
    return "\n".join(out)


def tiny_tables(path):
    """docs/quality.md's '#### model, protocol' tables -> {(model, protocol): {config: {budget%: increase}}}."""
    tables, current, budgets = {}, None, []
    for line in open(path):
        m = re.match(r"#### (\S+), (\S+)", line)
        if m:
            current = (m.group(1), m.group(2))
            tables[current] = OrderedDict()
            budgets = []
            continue
        if current is None or not line.startswith("|"):
            if current is not None and line.strip() and not line.startswith("|"):
                current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "configuration":
            budgets = [re.match(r"([\d.]+)%", c).group(1) + "%" for c in cells[1:]]
            continue
        if cells[0].startswith("---"):
            continue
        tables[current][cells[0]] = {b: float(v.rstrip("%")) for b, v in zip(budgets, cells[1:])
                                     if v not in ("—", "")}
    return tables


def persistence(paths):
    """Per-layer persistence tables (scissorhands_llamacpp persistence --csv), one column pair per file."""
    runs = [list(csv.DictReader(open(path))) for path in paths]
    def name(r):
        q = float(r.get("min_fraction", 0) or 0)
        return f"min age {r['min_age']}" + (f", min fraction {q:g}" if q > 0 else "")
    head = "| layer | attention | " + " | ".join(f"{name(run[0])}: ratio / chance / excess" for run in runs) + " |"
    out = [head, "|---|---|" + "---|" * len(runs)]
    def cell(overlap, late, early, tokens):
        p, c = overlap / late, early / tokens
        return f"{100 * p:.1f}% / {100 * c:.1f}% / {100 * (p - c) / (1 - c):.0f}%" if c < 1 else f"{100 * p:.1f}% / 100%"
    for i, row in enumerate(runs[0]):
        cols = [cell(float(run[i]["overlap"]), float(run[i]["late"]), float(run[i]["early"]),
                     float(run[i]["tokens_counted"])) for run in runs]
        out.append(f"| {row['layer']} | {row['attention']} | " + " | ".join(cols) + " |")
    for kind in ("global", "sliding"):
        cols = []
        for run in runs:
            rs = [r for r in run if r["attention"] == kind]
            cols.append(cell(*(sum(float(r[k]) for r in rs) for k in ("overlap", "late", "early", "tokens_counted"))))
        out.append(f"| all {kind} | | " + " | ".join(cols) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--default", default="scissorhands")
    ap.add_argument("--tiny", help="docs/quality.md: compression on the three tiny models too")
    ap.add_argument("--out-csv", help="directory for the merged gemma_<protocol>.csv")
    ap.add_argument("--persistence", nargs="*", default=[], help="persistence CSVs: the per-layer table")
    ap.add_argument("--texts", nargs="*", default=[], help="evaluate --texts-csv files: paired intervals")
    ap.add_argument("--name", default="Gemma 3 270M", help="the model's name in the tables' titles")
    a = ap.parse_args()
    texts = per_text(a.texts)
    if a.persistence:
        print("### Persistence of importance per layer (ratio |E ∩ L| / |L|; chance |E| / S; excess "
              "(ratio - chance) / (1 - chance))\n\n" + persistence(a.persistence) + "\n")
    cells = merge(a.runs)
    groups = []
    for protocol in ("decode", "prefill"):
        if (protocol, "full", "100%") not in cells:
            continue
        text, policies, budgets = table(cells, protocol)
        print(f"### {a.name}, {protocol}\n\n{text}\n")
        print(f"#### The goal ({a.default}), {protocol}\n\n{goal(cells, protocol, a.default, budgets)}\n")
        if texts:
            print(f"#### {a.default} minus each baseline, {protocol} (points of NLL increase; negative: "
                  f"{a.default} better; 95% paired bootstrap interval over the texts)\n\n"
                  f"{margins(texts, protocol, a.default, budgets)}\n")
        rows = OrderedDict((p, {b: increase(cells[(protocol, p, b)]) for b in budgets if (protocol, p, b) in cells})
                           for p in policies)
        print(f"#### Compression (text / budget) within 1% and 0.5% of the full cache, {protocol}\n\n"
              f"{compression(rows, budgets)}\n")
        groups.append((a.name, protocol, rows, budgets, True))
        if a.out_csv:
            with open(f"{a.out_csv}/gemma_{protocol}.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["model", "protocol", "policy", "budget", "budget_tokens", "texts", "predictions", "nll",
                            "nll_full", "increase_percent", "peak_cells", "evicted", "seconds", "library_seconds"])
                for (p, policy, b), c in cells.items():
                    if p == protocol:
                        w.writerow(["gemma-3-270m-q4_k_m.gguf", p, policy, b, c["budget_tokens"], c["texts"],
                                    c["predictions"], f"{c['nll_sum'] / c['predictions']:.6f}",
                                    f"{c['full_sum'] / c['predictions']:.6f}", f"{increase(c):.4f}", c["peak"], 0,
                                    f"{c['seconds']:.2f}", 0])
    if a.tiny:
        order = {"stories260K": 0, "tinystories656k": 1, "babyllama105": 2}
        for (model, protocol), configs in sorted(tiny_tables(a.tiny).items(), key=lambda kv: (order.get(kv[0][0], 9),)):
            budgets = []
            for values in configs.values():
                budgets += [b for b in values if b not in budgets]
            budgets.sort(key=pct)
            groups.append((model, protocol.split(":")[0], configs, budgets, False))
    print("#### Compression within 1% / 0.5% of the full cache's NLL (text / budget; '<N×': not even at the "
          "largest budget measured)\n")
    tiny_order = ["stories260K", "tinystories656k", "babyllama105"]
    print(headline(sorted(groups, key=lambda g: (g[1], tiny_order.index(g[0]) if g[0] in tiny_order else 9))))


if __name__ == "__main__":
    main()
