#!/usr/bin/env python3
"""Writes the hand-encoded regression inputs of tests/fuzz/corpus/ (and the
hand-made seeds of the token-level modes, seed-tl-*, below) for the
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


# ---------------------------------------------------------------------------
# Token-level eviction (a first byte in [97, 118] or [198, 217]; then the
# mode byte, byte % 8: 0-1 shared_heads compress, 2-7 shared_layers; then
# the paged flag). These inputs are seeds rather than regressions: hand-made
# programs that reach select + compact, select + forget on a slot-list
# engine (page size 1) and shared_heads compress, so the corpus replay
# exercises each mode whatever the fuzzer kept.
TL = 200  # a first byte in the token-level range


def tl_settings(recent=1, sinks=0, m=2, normalize=1, preserve=0):
    # window 6, recent, sinks, evict_count m, alpha, decay, normalize, compaction, seed word, rarely
    return [5, recent, sinks, m - 1, 0, 0, normalize, preserve] + Z4 + [0]


def layers_setup(mode, paged, layers, batch, heads, dim, tokens, capacity=12, page_size=None, pages=16,
                 mapping=0, **settings):
    # layers_case::setup: generator word, settings, layers, batch, heads,
    # head_dim; contiguous: capacity; paged: page size (flag 1: one token, or
    # 0 then 1 + byte % 4), max pages, pool pages; K and V layouts per layer
    # (NHD, HND alternating); spare rows 0, state capacity untouched, the
    # engine respects it; mapping mode; the tokens of each sequence.
    out = [TL, mode, int(paged)] + Z4 + tl_settings(**settings) + [layers - 1, batch - 1, heads - 1, dim - 1]
    if paged:
        out += [1] if page_size == 1 else [0, page_size - 1]
        out += [7, pages - 1]
    else:
        out += [capacity - 1]
    for l in range(layers):
        out += [l % 2, (l + 1) % 2]
    out += [0, 0, 0, mapping]
    return out + tokens


def observe_all(attention=True, q_len=1):
    # op 1; observe (not admit only) when the policy needs attention; no
    # layer skipped; group 1; through the model's for_batch; q_len.
    return [1] + ([1] if attention else []) + [0, 0, 1, q_len]


def evict(budget_byte, *, compact=True, pins=None, cache_slots=1, freed=1, paged=False, layers=1):
    # op 4: select reads layer 0's view; not rare; budget = floor + byte
    # (floor = recent + sinks + m); no extra stride, no workspace slack;
    # cache_slots; (contiguous) freed_pages; pinned_prefix (None: none; else
    # mode 2, one byte per sequence: min(length, byte % 4)); compact or
    # forget; no select probe. Then: no layer skipped; per layer no probe
    # and, for a contiguous compact, the flag that passes its (empty)
    # workspace.
    out = [4, 0, 0, budget_byte, 0, 0, cache_slots] + ([] if paged else [freed])
    out += [0] if pins is None else [2] + pins
    out += [int(compact), 0, 0]
    return out + ([0] + ([1] if compact and not paged else [])) * layers


def append_observe(adds, attention=True, q_len=1):
    # op 13: append `adds` tokens per sequence (byte % 4), then observe_all.
    return [13] + adds + observe_all(attention, q_len)[1:]


def shared_heads_setup(tokens):
    # fuzz_case::setup (contiguous_setup with two KV heads and capacity 12):
    # four `rarely` bytes per token (K and V rows of each head).
    return [TL, 0, 0] + Z4 + settings() + [0, 1, 1] + [11, 0, 0] + [0, 0, 0, 0] + [0] + [tokens] + [0, 0, 0, 0] * tokens


TL_INPUTS = {
    # shared_heads compress (Scissorhands, mean over 2 heads): 8 tokens,
    # observed twice, compress at budget 5; 2 more, observed, budget 6.
    # (OBSERVE + [0]: one `rarely` byte more for the second head's queries;
    # op 0 appends 2 tokens, 4 `rarely` bytes each.)
    "seed-tl-shared-heads-compress": shared_heads_setup(8) + OBSERVE + [0] + OBSERVE + [0]
    + [6, 0, 0, 0, 4, 0, 0, 0, 0, 0] + [0, 2] + [0] * 8 + OBSERVE + [0] + [6, 0, 0, 0, 5, 0, 0, 0, 0, 0],
    # shared_layers (Scissorhands, mean, mean) over 3 layers (NHD/HND
    # alternating), 2 sequences of 10 and 8 tokens, 2 KV heads, contiguous:
    # observe, append + observe; select at budget 3 + 5 with pinned
    # prefixes and cache_slots, compact every layer (fill_holes); append +
    # observe; select at budget 7, forget every layer (the engine moves
    # the rows itself).
    "seed-tl-layers-compact-forget": layers_setup(2, False, 3, 2, 2, 2, [10, 8], recent=1, m=2)
    + observe_all() + append_observe([1, 1]) + evict(5, pins=[3, 2], layers=3)
    + append_observe([2, 3]) + evict(4, compact=False, layers=3),
    # The same on preserve_order, H2O (max over heads, mean over layers),
    # a paged cache of 3-token pages (shrink_page_table applies new_lengths).
    "seed-tl-layers-paged-compact": layers_setup(4, True, 2, 2, 2, 2, [9, 11], page_size=3, preserve=1, m=2)
    + observe_all(q_len=2) + evict(4, paged=True, layers=2) + append_observe([3, 1], q_len=2)
    + evict(2, pins=[1, 1], paged=True, layers=2),
    # A slot-list engine (page size 1) over 2 layers on shuffled state
    # rows: select with cache_slots, the engine frees them and drops them
    # from its lists, forget every layer; then select + compact.
    "seed-tl-layers-slot-list-forget": layers_setup(4, True, 2, 2, 1, 2, [7, 6], page_size=1, mapping=2, m=1)
    + observe_all() + append_observe([1, 2]) + evict(3, compact=False, paged=True, layers=2)
    + append_observe([2, 2]) + evict(1, paged=True, layers=2),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name, data in list(INPUTS.items()) + list(TL_INPUTS.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(data))


if __name__ == "__main__":
    main()
