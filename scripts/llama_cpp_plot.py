#!/usr/bin/env python3
"""NLL increase over the full cache against cells kept, one panel per
protocol, from scissorhands_llamacpp evaluate's CSVs (gnuplot draws it).

    llama_cpp_plot.py DECODE.csv PREFILL.csv OUT.png [POLICY ...]

With POLICY names, only those are drawn.
"""
import csv
import subprocess
import sys


def series(path, only):
    rows = [r for r in csv.DictReader(open(path)) if r["policy"] != "full" and (not only or r["policy"] in only)]
    by_policy = {}
    for r in rows:
        kept = 100.0 * int(r["budget_tokens"]) / 2000 if not r["budget"].endswith("%") else float(r["budget"][:-1])
        by_policy.setdefault(r["policy"], []).append((kept, float(r["increase_percent"])))
    model = rows[0]["model"] if rows else "?"
    return model, {p: sorted(v) for p, v in by_policy.items()}


def main():
    decode, prefill, out = sys.argv[1:4]
    only = set(sys.argv[4:])
    script = [
        "set terminal pngcairo size 1400,560 font ',11'",
        f"set output '{out}'",
        "set multiplot layout 1,2",
        "set logscale x 2",
        "set xlabel 'cells kept (% of the text)'",
        "set ylabel 'NLL increase over the full cache (%)'",
        "set key top right",
        "set grid",
        "set termoption noenhanced",
    ]
    for path, name in ((decode, "decode (32 tokens a step, m = 32)"), (prefill, "prefill (half the text, compressed once)")):
        model, data = series(path, only)
        script.append(f"set title '{model}, llama.cpp: {name}'")
        plots, blocks = [], []
        for i, (policy, points) in enumerate(data.items()):
            plots.append(f"'-' using 1:2 with linespoints lw 2 title '{policy}'")
            blocks.append("\n".join(f"{x} {y}" for x, y in points) + "\ne")
        script.append("plot " + ", ".join(plots))
        script.extend(blocks)
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
