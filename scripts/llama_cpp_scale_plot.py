#!/usr/bin/env python3
"""Decode tokens/s and KV memory against the text's length, stock
llama.cpp against the library's eviction, from scissorhands_llamacpp
scale's CSV (scripts/llama_cpp_scale.sh; gnuplot draws it).

    llama_cpp_scale_plot.py SCALE.csv OUT.png
"""
import csv
import subprocess
import sys


def main():
    path, out = sys.argv[1:3]
    rows = list(csv.DictReader(open(path)))
    series = {}
    for r in rows:
        model = r["model"].split("-")[0].split(".")[0]
        method = "stock" if r["method"] == "stock" else f"{r['method']} at {int(r['n_ctx']) - 256}"
        label = f"{model} {method} {r['threads']}t"
        series.setdefault(label, []).append(
            (int(r["length"]), float(r["tokens_per_s"]), float(r["kv_mib_allocated"]), float(r["peak_rss_mib"])))
    script = [
        "set terminal pngcairo size 1500,520 font ',11'",
        f"set output '{out}'",
        "set multiplot layout 1,3",
        "set logscale x 2",
        "set xlabel 'tokens in the text'",
        "set key top right font ',9'",
        "set grid",
        "set termoption noenhanced",
    ]
    for column, title, ylabel in ((1, "decode speed (last 256 tokens)", "tokens/s"),
                                  (2, "KV cache, as llama.cpp allocates it", "MiB"),
                                  (3, "peak resident memory", "MiB")):
        script.append(f"set title '{title}'")
        script.append(f"set ylabel '{ylabel}'")
        plots, blocks = [], []
        for label, points in sorted(series.items()):
            dash = "dt 2" if "stock" in label else "dt 1"
            plots.append(f"'-' using 1:2 with linespoints lw 2 {dash} title '{label}'")
            blocks.append("\n".join(f"{p[0]} {p[column]}" for p in sorted(points)) + "\ne")
        script.append("plot " + ", ".join(plots))
        script.extend(blocks)
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
