#!/usr/bin/env python3
"""Writes the hand-encoded regression inputs of tests/fuzz/corpus/ for the
current input decoding of fuzz_host.cpp (setup, then one program step per
operation byte; byte_source: in(lo, hi) reads one byte, lo + byte % range,
for ranges up to 256; flag() is byte & 1; rarely() is byte >= 236).

    python3 tests/fuzz/make_regress.py tests/fuzz/corpus

Each input must still reach the condition its bug was about: check with
    FUZZ_TRACE=1 build-fuzz/fuzz_host tests/fuzz/corpus/regress-<name>
(the trace prints the decoded setup, each operation and the refusal).
regress-ring-words-overflow is not written here: its bug is in the setup
prefix (settings), whose decoding has not changed since it was found.
Re-run this script, and check the traces, whenever the decoding changes.
"""
import os
import sys

Z4 = [0, 0, 0, 0]


def settings():
    # window, recent, sinks, evict_count, alpha, decay, normalize, compaction, seed word, rarely
    return [0, 0, 0, 0, 0, 0, 0, 0] + Z4 + [0]


def contiguous_setup(tokens=2):
    # policy 1 (h2o), contiguous; generator word; settings (w 1, r 0, s 0, m 1);
    # batch 1, 1 KV head, head_dim 1; capacity 4, NHD K and V; state shape
    # untouched, no spare row, capacity as the cache, engine respects it;
    # mapping: row b; `tokens` tokens appended (two `rarely` bytes per row).
    return [1, 0] + Z4 + settings() + [0, 0, 0] + [3, 0, 0] + [0, 0, 0, 0] + [0] + [tokens] + [0, 0] * tokens


def paged_setup(tokens=3):
    # policy 1 (h2o), paged; page_size 2, 2 pages per sequence at most, 4 in
    # the pool, NHD K and V; otherwise as contiguous_setup.
    return [1, 1] + Z4 + settings() + [0, 0, 0] + [1, 1, 3, 0, 0] + [0, 0, 0, 0] + [0] + [tokens] + [0, 0] * tokens


ADMIT = [5, 0, 0]  # op 5, no view damage, model rows
# op 2: no damage, model rows; uniform queries (q_heads x1, q_len 1), no
# padding, no stride damage, full buffer, no spike, no bad value, not null
OBSERVE = [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]

INPUTS = {
    # 2a7e77d: compress on a contiguous cache stored through
    # freed_pages = {nullptr, batch}. Admit, then compress at budget 2
    # (workspace exact) with freed_pages present, damaged to {nullptr, batch}.
    "regress-freed-pages-null": contiguous_setup() + ADMIT + [6, 0, 0, 0, 1, 0, 0, 0, 1, 236, 1],
    # 916dce5: state.step never validated. Poke a negative step, observe;
    # poke INT64_MAX, observe: both refused ('state.step').
    "regress-step-overflow": contiguous_setup() + [9, 0, 0, 0, 2, 1, 0, 0, 0, 5] + OBSERVE
    + [9, 0, 0, 0, 2, 0, 0] + OBSERVE,
    # 1b85667: max_capacity() multiplied in int32 before validation. Compress
    # on a view damaged to max_pages_per_sequence = INT32_MAX (page_size 2):
    # compress_workspace_bytes runs on it first, then the refusal.
    "regress-max-capacity-overflow": paged_setup() + [6, 236, 5, 0, 0, 0, 1, 0, 0, 0, 0, 0],
    # 6f1a47f: the message of the indptr size check computed batch + 1 in
    # int32. Admit on a view damaged to batch = INT32_MAX.
    "regress-indptr-message-overflow": paged_setup() + [5, 236, 0, 0, 0, 0],
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name, data in INPUTS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(data))


if __name__ == "__main__":
    main()
