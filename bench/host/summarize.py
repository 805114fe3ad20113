#!/usr/bin/env python3
"""Turns the host benchmark's JSON output into the tables of bench/RESULTS.md.

    scissorhands_bench_host --benchmark_repetitions=3 \
        --benchmark_out=host.json --benchmark_out_format=json
    python3 bench/host/summarize.py host.json

With repetitions the median of each benchmark is used, followed by its
coefficient of variation (±, standard deviation / mean); otherwise its single
run. Times are per call, CPU time of the calling thread (for compress and the
baseline, of the manually timed call alone); bandwidth in GiB/s (2^30 bytes,
as Google Benchmark prints it), computed on the same time.
"""
import json
import re
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    runs, cv = {}, {}
    has_median = any(b.get("aggregate_name") == "median" for b in data["benchmarks"])
    for b in data["benchmarks"]:
        if b.get("error_occurred"):
            sys.exit(f"{b['name']}: {b.get('error_message')}")
        name = re.sub(r"/(manual|real)_time$", "", b["run_name"])
        if has_median and b.get("aggregate_name") == "cv":
            manual = b["run_name"].endswith("/manual_time")
            cv[name] = b["real_time" if manual else "cpu_time"]  # a fraction: standard deviation / mean
        if has_median and b.get("aggregate_name") != "median":
            continue
        runs[name] = b
    return data["context"], runs, cv


def fmt_us(b, cv, name):
    spread = f" ±{100 * cv[name]:.0f}%" if name in cv else ""
    return f"{us(b):,.1f}{spread}"


def us(b):
    # CPU time: Google Benchmark's for observe; for compress and the baseline
    # the manual time, which the binary takes from the thread's CPU clock.
    manual = b["run_name"].endswith("/manual_time")
    return in_us(b, "real_time" if manual else "cpu_time")


def in_us(b, field):
    return b[field] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]


def gib(b):
    return b["bytes_per_second"] / 2**30


def shape(name):
    return dict(re.findall(r"(batch|B|m|T):(\d+)", name))


def wall_us(b):
    # The threaded benchmarks are timed in wall time (real or manual).
    return in_us(b, "real_time")


def one_thread(name):
    # A threaded benchmark's run on one thread (its partner: the same on two).
    return "_threads/" in name and "/T:1" in name


def pairs(runs, first, partner):
    """(name, run, partner's name, partner's run, shape) for each run whose
    name `first` accepts and whose partner (`partner` of its name) ran too."""
    for name, b in runs.items():
        other = partner(name) if first(name) else None
        if other in runs:
            yield name, b, other, runs[other], shape(name)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: summarize.py BENCHMARK_JSON")
    context, runs, cv = load(sys.argv[1])
    print(f"<!-- {context['date']}, {context['num_cpus']} CPUs at {context['mhz_per_cpu']} MHz -->")
    print()
    print("| operation | batch | B | time / call (µs) | GiB/s | M token-heads/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, b in runs.items():
        if not name.startswith("observe") or "_threads" in name:
            continue
        s = shape(name)
        op = name.split("/")[0]
        print(f"| {op} | {s['batch']} | {s['B']} | {fmt_us(b, cv, name)} | {gib(b):.2f} | "
              f"{b['items_per_second'] / 1e6:.2f} |")
    print()
    print("| policy | batch | B | m | library (µs) | library GiB/s | rows moved / call | naive (µs) | naive GiB/s | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, b, naive_name, naive, s in pairs(runs, lambda n: n.startswith("compress/"),
                                               lambda n: "naive/" + n[len("compress/"):]):
        policy = name.split("/")[1]
        print(f"| {policy} | {s['batch']} | {s['B']} | {s['m']} | {fmt_us(b, cv, name)} | {gib(b):.2f} | "
              f"{b['moves/call']:,.0f} | {fmt_us(naive, cv, naive_name)} | {gib(naive):.2f} | {us(naive) / us(b):.1f}× |")
    copies = [(name, b) for name, b in runs.items() if name.startswith("copy/")]
    if copies:
        print()
        print("| memcpy size (KiB) | time (µs) | GiB/s copied |")
        print("|---:|---:|---:|")
        for name, b in copies:
            print(f"| {name.split(':')[1]} | {fmt_us(b, cv, name)} | {gib(b):.2f} |")
    if any(one_thread(name) for name in runs):
        print()
        print("| operation | batch | B | m | 1 thread (µs) | 2 threads (µs) | speed-up |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, one, _, two, s in pairs(runs, one_thread, lambda n: n.replace("/T:1", "/T:2")):
            op = name.split("/")[0]
            print(f"| {op} | {s['batch']} | {s['B']} | {s.get('m', '—')} | {wall_us(one):,.0f} | {wall_us(two):,.0f} | "
                  f"{wall_us(one) / wall_us(two):.2f}× |")


if __name__ == "__main__":
    main()
