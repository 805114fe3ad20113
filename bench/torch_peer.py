#!/usr/bin/env python3
"""The PyTorch CPU peer of host::compress, run by hand (needs torch; not CI).

A press-style eviction (kvpress and similar libraries): per (sequence, KV
head) scores -> the protected recent tokens masked to +inf -> topk of the
tokens to keep (or of the m victims, then a keep mask: whichever is faster
at the shape) -> index_select of the kept K and V rows into new tensors. It is timed on the shapes of the library's compress_threads
benchmark (Llama-3-8B layer: 8 KV heads, head_dim 128, fp32, B = 2048,
m = 1 and B/16, batch 1 and 8, recent 10) with torch.set_num_threads(T) for
T = 1 and 2, and the library's benchmark binary is run in the same
invocation, so the ratios come from one run on one machine:

    python3 bench/torch_peer.py build-bench/bench/host/scissorhands_bench_host

What each side does per call. Library (compress_threads/...): validation, a
scan of every token's score and position, selection, and the moves of the
rows actually evicted (K, V and its per-token state), in place. Peer:
topk over every token's score, then index_select of every kept K and V
row into new tensors (torch has no in-place compaction); its scores are a tensor it is handed
(the library keeps and moves its own). The peer's layout is HND
([batch, kv_heads, tokens, head_dim], as Hugging Face caches are), the
library's NHD; both hold the same bytes.
"""
import argparse
import json
import subprocess
import sys
import time

BATCHES = (1, 8)
BUDGET = 2048
KV_HEADS = 8
HEAD_DIM = 128
RECENT = 10
THREADS = (1, 2)


def peer_seconds(torch, batch, m, threads, repeats):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(batch * 131 + m)
    keys = torch.randn(batch, KV_HEADS, BUDGET, HEAD_DIM, generator=g)
    values = torch.randn(batch, KV_HEADS, BUDGET, HEAD_DIM, generator=g)
    # Scissorhands-like window counts (floor(401 u^3)) plus a tie-break by
    # position, so that topk's choice is well defined, as the library's is.
    u = torch.rand(batch, KV_HEADS, BUDGET, generator=g)
    scores = torch.floor(401.0 * u ** 3) + torch.arange(BUDGET) * 1e-6
    kept = BUDGET - m
    # Rows of (sequence, head) h start at h * BUDGET in the flattened cache:
    # one index_select per tensor (measured 3-10x faster on CPU than gather
    # with an expanded index or advanced indexing, which press code also uses).
    flat_k = keys.reshape(-1, HEAD_DIM)
    flat_v = values.reshape(-1, HEAD_DIM)
    row_start = (torch.arange(batch * KV_HEADS) * BUDGET).reshape(batch, KV_HEADS, 1)

    slots = torch.arange(BUDGET).expand(batch, KV_HEADS, BUDGET)

    def evict_topk_kept():
        s = scores.clone()
        s[..., BUDGET - RECENT:] = float("inf")  # the recent window is protected
        idx = (s.topk(kept, dim=-1, sorted=False).indices + row_start).reshape(-1)
        return flat_k.index_select(0, idx), flat_v.index_select(0, idx)

    def evict_topk_victims():
        # topk of the m victims (cheap for small m), a keep mask, its slots.
        s = scores.clone()
        s[..., BUDGET - RECENT:] = float("inf")
        victims = s.topk(m, dim=-1, largest=False, sorted=False).indices
        keep = torch.ones(batch, KV_HEADS, BUDGET, dtype=torch.bool).scatter_(-1, victims, False)
        idx = (slots[keep].reshape(batch, KV_HEADS, kept) + row_start).reshape(-1)
        return flat_k.index_select(0, idx), flat_v.index_select(0, idx)

    # The peer gets the faster of the two ways of choosing, per shape.
    return min(timed(evict_topk_kept, repeats), timed(evict_topk_victims, repeats))


def timed(evict, repeats):
    """Median over `repeats` of the mean call time in 0.2 s of calls."""
    for _ in range(3):
        evict()
    means = []
    for _ in range(repeats):
        start = time.perf_counter()
        n = 0
        while True:
            evict()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed > 0.2:
                break
        means.append(elapsed / n)
    means.sort()
    return means[len(means) // 2]


def library_seconds(binary):
    out = subprocess.run(
        [binary, "--benchmark_filter=compress_threads/", "--benchmark_format=json",
         "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true"],
        check=True, capture_output=True, text=True).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        # compress_threads/scissorhands/batch:1/B:2048/m:1/T:1/manual_time
        parts = dict(p.split(":") for p in b["run_name"].split("/") if ":" in p)
        key = (int(parts["batch"]), int(parts["m"]), int(parts["T"]))
        result[key] = b["real_time"] * {"us": 1e-6, "ms": 1e-3, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", help="path to scissorhands_bench_host (a Release build)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("torch is not installed: pip install torch (this script is run by hand, not in CI)")
    library = library_seconds(args.bench)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads available")
    print("| batch | m | threads | library µs | torch µs | torch / library |")
    print("|---|---|---|---|---|---|")
    for batch in BATCHES:
        for m in (1, BUDGET // 16):
            for threads in THREADS:
                peer = peer_seconds(torch, batch, m, threads, args.repeats)
                lib = library.get((batch, m, threads))
                if lib is None:
                    sys.exit(f"the benchmark binary has no compress_threads figure for batch {batch} m {m} T {threads}")
                print(f"| {batch} | {m} | {threads} | {lib * 1e6:.0f} | {peer * 1e6:.0f} | {peer / lib:.1f} |")


if __name__ == "__main__":
    main()
