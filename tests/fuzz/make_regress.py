#!/usr/bin/env python3
"""Writes the hand-encoded regression inputs of tests/fuzz/corpus/ (and the
hand-made seeds of the token-level modes, seed-tl-*, and of the quantized
mode, seed-q-* with its regressions regress-q-*, below) for the
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


# ---------------------------------------------------------------------------
# Quantized caches (a first byte in [161, 177]; fuzz_quantized.hpp): then
# the policy (byte % 8: 0 scissorhands, 1 h2o, 2 key_norm, 3 attention
# mass over a sliding window (gqa max), 4 scissorhands with shared_heads,
# 5 streaming, 6 important indicator with exponential decay, 7 key_norm)
# and the paged flag. Setup: generator word, settings, int4 flag, group
# size (int8 1 << byte % 5, int4 2 << byte % 5), groups per row (1 +
# byte % 4), batch (1 + byte % 3), KV heads (1 + byte % 3), capacity (1 +
# byte % 24) or page size (1 + byte % 5), max pages (1 + byte % 6), pool
# pages (1 + byte % 12); pick_strides for K codes, V codes, K parameters,
# V parameters; state capacity (flag, then 1 + byte % 30), spare rows
# (byte % 3), mapping (byte % 3: row b, row b passed, shuffled); the tokens
# of each sequence (byte % 27). Operations: byte % 10 (0-1 append, 2-3
# observe_queries, 4 admit, 5-6 compress, 7 poke, 8 repair, 9 retire). A
# library call starts with a damage byte (< 192: none; else byte % 11
# picks the damage, then its own bytes: see the dmg_* helpers).
# The seed-q-* inputs are seeds (each reaches what its comment says: check
# with FUZZ_TRACE=1); the regress-q-* inputs reproduce library bugs.
Q = 170  # a first byte in the quantized range

NHD, HND = [0], [1]


def padded(perm, pads):
    # pick_strides case 2: the levels nested in permutation `perm`, each padded.
    return [2, perm] + list(pads)


def custom(outer, head, token):
    # pick_strides case 3: any small strides (-1..40).
    return [3, outer + 1, head + 1, token + 1]


def q_settings(window=6, recent=1, sinks=0, m=2, normalize=0, preserve=0):
    return [window - 1, recent, sinks, m - 1, 0, 0, normalize, preserve] + Z4 + [0]


def q_setup(policy, paged, *, int4=False, group=4, groups=2, batch=2, heads=2, capacity=20, page=(3, 6, 12),
            layouts=(NHD, NHD, NHD, NHD), state_capacity=None, spare=0, mapping=0, tokens=(10, 8), **settings):
    group_code = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4}[group] if not int4 else {2: 0, 4: 1, 8: 2, 16: 3, 32: 4}[group]
    out = [Q, policy, int(paged)] + Z4 + q_settings(**settings)
    out += [int(int4), group_code, groups - 1, batch - 1, heads - 1]
    out += [page[0] - 1, page[1] - 1, page[2] - 1] if paged else [capacity - 1]
    for layout in layouts:
        out += list(layout)
    out += [0] if state_capacity is None else [1, state_capacity - 1]
    out += [spare, mapping]
    return out + list(tokens)


NONE = [0]  # no damage


def dmg_group(sub, choice=0):
    # 0: group 0, 1: negative, 2: head_dim + 1, 3: int4 1 / int8 2 * head_dim, 4: another valid one
    return [192, 0, sub, choice]


def dmg_kind(sub, garbage=0):
    # 0: kind 0, 1: garbage_int (table index `garbage`), 2: the other kind
    return [192, 1, sub] + ([garbage] if sub == 1 else [])


def dmg_params(v, null, cut=1):
    return [192, 3 if v else 2, int(null), cut - 1]


def dmg_alias(v_onto_k):
    return [192, 4, int(v_onto_k)]


def dmg_layout(params, v, sub, strides=None):
    # sub 0: token stride 0, 1: head stride 0, 2: `strides` (each -1..40)
    return [192, 5 if params else 6, int(v), sub] + ([s + 1 for s in strides] if sub == 2 else [])


def dmg_codes(v, sub, cut=1):
    # sub 0: null, 1: short by `cut`, 2: aliasing the other code buffer
    return [192, 7, int(v), sub, cut - 1]


def dmg_head_dim(sub, more=0):
    # sub 0: 1024 (group 1024), 1: 513 + more, 2: 0 (more even) or -head_dim
    return [192, 8, sub, more]


def dmg_out(v, new_lengths):
    # compress: out.new_lengths (or out.freed_pages) over the K (or V) parameters
    return [192, 9, int(v), int(new_lengths)]


def dmg_ws(v):
    # compress: the workspace over the K (or V) parameters
    return [192, 10, int(v)]


def q_append(adds):
    return [0] + list(adds)


def q_observe(dmg=NONE, group=1, dense=1, ragged=None, lse=0, scale=0, plan=None):
    # ragged: the query count of each sequence (else `dense` queries each);
    # plan: (slices, reverse) for plan_observe_queries run in slices.
    out = [2] + dmg + [group - 1, int(ragged is not None)] + (list(ragged) if ragged is not None else [dense])
    out += [lse, scale]
    return out + ([1, plan[0] - 1, int(plan[1])] if plan else [0])


def q_admit(dmg=NONE):
    return [4] + dmg


def q_compress(budget, dmg=NONE, plan=None, slack=0, freed=0, paged=False):
    # budget: 1 + byte % (longest length + 1); not rare (byte 0 before it).
    out = [5] + dmg + [0, budget - 1] + ([1, plan[0] - 1, int(plan[1])] if plan else [0]) + [slack]
    return out + ([] if paged else [freed])


NAN, INF, NEG_INF, HUGE, NEG_HUGE, DENORMAL = 0, 1, 2, 3, 4, 5


def q_poke(b, h, v, index, value, pick):
    # parameter `index` of the row at slot pick % length of (b, h), K or V
    return [7, b, h, int(v), index, value, pick]


REPAIR = [8]


def q_retire(b):
    return [9, b]


Q_INPUTS = {
    # int8 (groups of 4, head_dim 8), Scissorhands, contiguous, padded K
    # parameters, shuffled state rows: observe (dense, lse, a plan in 2
    # slices), ragged observe, compress at 8 (serial, then a plan in 3
    # slices run backwards): evictions in both sequences.
    "seed-q-int8-evict": q_setup(0, False, group=4, groups=2, capacity=20, tokens=(12, 9), spare=1, mapping=2,
                                 layouts=(NHD, HND, padded(1, (1, 0, 2)), NHD), recent=1, m=2)
    + q_observe(dense=2, lse=1, plan=(2, False)) + q_append((1, 1)) + q_observe(ragged=(1, 0), group=2)
    + q_compress(8) + q_append((2, 1)) + q_observe(dense=1, scale=1) + q_compress(8, plan=(3, True), freed=1)
    + q_append((3, 3)) + q_observe(ragged=(2, 1), lse=1) + q_compress(9, slack=3),
    # int4 (groups of 4, head_dim 8), H2O, paged (pages of 3, 6 per
    # sequence, 12 in the pool), HND codes, padded parameters,
    # preserve_order: observe, compress (pages released), a plan; retire
    # sequence 0 and start again.
    "seed-q-int4-paged": q_setup(1, True, int4=True, group=4, groups=2, heads=1, tokens=(10, 14),
                                 layouts=(HND, NHD, padded(3, (2, 1, 0)), padded(0, (0, 0, 1))), preserve=1, m=2)
    + q_observe(dense=2) + q_compress(9, paged=True) + q_append((2, 3)) + q_observe(ragged=(1, 2), lse=1)
    + q_compress(8, plan=(2, False), paged=True, slack=5) + q_retire(0) + q_append((3, 1)) + q_observe()
    + q_compress(7, paged=True),
    # key_norm (a static scorer: dequantized K norms at admission), int4
    # groups of 2 (head_dim 6), 3 KV heads, contiguous HND: admit, compress.
    "seed-q-keynorm-admit": q_setup(2, False, int4=True, group=2, groups=3, batch=1, heads=3, capacity=16,
                                    tokens=(11,), layouts=(HND, HND, NHD, HND), recent=0, m=1)
    + q_admit() + q_compress(8) + q_append((3,)) + q_observe() + q_compress(8),
    # Bad group sizes (int4, groups of 4): 0 on observe_queries, negative on
    # admit, head_dim + 1 on compress, 1 (odd) on observe; then a valid call.
    "seed-q-bad-group": q_setup(0, False, int4=True, group=4, groups=2, tokens=(6, 7))
    + q_observe(dmg_group(0)) + q_admit(dmg_group(1)) + q_compress(5, dmg_group(2)) + q_observe(dmg_group(3))
    + q_observe() + q_compress(5),
    # Bad kinds (int8, groups of 1): 0 on observe, 7 on admit, int4 over
    # odd groups on compress (a group-size refusal); then a valid call.
    "seed-q-bad-kind": q_setup(1, True, group=1, groups=4, tokens=(5, 4))
    + q_observe(dmg_kind(0)) + q_admit(dmg_kind(1, garbage=4)) + q_observe()
    + q_compress(4, dmg_kind(2), paged=True) + q_compress(4, paged=True),
    # Parameter buffers short or null, K and V, on each entry point.
    "seed-q-params-short-null": q_setup(0, False, group=2, groups=2, tokens=(6, 6), layouts=(NHD, NHD, HND, HND))
    + q_observe(dmg_params(False, False, cut=1)) + q_observe(dmg_params(True, True)) + q_admit(dmg_params(False, True))
    + q_observe() + q_compress(5, dmg_params(True, False, cut=7)) + q_compress(5),
    # V parameters aliasing K's and the reverse; then a valid compress.
    "seed-q-params-alias": q_setup(4, True, int4=True, group=2, groups=2, tokens=(7, 5))
    + q_observe(dmg_alias(True)) + q_observe() + q_compress(6, dmg_alias(False), paged=True)
    + q_compress(6, paged=True),
    # Parameter layouts whose rows overlap (token stride 0, head stride 0,
    # negative strides) on K and V parameters; then valid calls.
    "seed-q-params-layout-overlap": q_setup(0, False, group=4, groups=2, tokens=(8, 6))
    + q_observe(dmg_layout(True, False, 0)) + q_admit(dmg_layout(True, True, 1))
    + q_observe(dmg_layout(True, False, 2, (10, -1, 2))) + q_observe(dmg_layout(True, True, 2, (4, 0, 4)))
    + q_observe() + q_compress(6),
    # A setup whose V parameter layout overlaps (pick_strides' small
    # strides): every call is refused, naming it.
    "seed-q-layout-overlap-setup": q_setup(1, False, group=4, groups=2, capacity=6, tokens=(4, 4),
                                           layouts=(NHD, NHD, NHD, custom(12, 2, 1)))
    + q_observe() + q_admit() + q_compress(3),
    # Code buffers and layouts, and head_dim: an overlapping K code layout,
    # null / short / aliasing code buffers, head_dim 1024 and 600 (above
    # 512 for a quantized cache) and 0; then a valid call.
    "seed-q-codes-head-dim": q_setup(0, True, group=4, groups=2, tokens=(6, 5))
    + q_observe(dmg_layout(False, False, 0)) + q_observe(dmg_codes(False, 0)) + q_admit(dmg_codes(True, 1, cut=3))
    + q_observe(dmg_codes(True, 2)) + q_observe(dmg_head_dim(0)) + q_admit(dmg_head_dim(1, more=87))
    + q_compress(5, dmg_head_dim(2), paged=True) + q_observe() + q_compress(5, paged=True),
    # A NaN K scale in a held row of sequence 0 (Scissorhands, its newest
    # token, protected by recent = 2): observe with queries for it refused
    # ('cache.k_params'); ragged observe without queries for it accepted;
    # admit and compress accepted (they never read K; the NaN row moves with
    # its token); repair; an Inf K scale, refused again; repair; observe
    # accepted.
    "seed-q-k-scale-nonfinite": q_setup(0, False, group=2, groups=2, tokens=(9, 7), recent=2, m=2)
    + q_observe() + q_poke(0, 1, False, 1, NAN, 8) + q_observe() + q_observe(ragged=(0, 2)) + q_append((1, 1))
    + q_admit() + q_compress(8) + REPAIR + q_poke(0, 0, False, 0, INF, 0) + q_observe(ragged=(1, 1)) + REPAIR
    + q_observe(),
    # key_norm reads only the new rows: -Inf in an old row, admit accepted;
    # a NaN in a new row, admit refused; repair, admit accepted.
    "seed-q-k-scale-static": q_setup(2, False, group=2, groups=2, batch=1, heads=2, tokens=(6,), recent=0, m=1)
    + q_admit() + q_poke(0, 1, False, 0, NEG_INF, 1) + q_append((2,)) + q_admit() + q_append((1,))
    + q_poke(0, 0, False, 1, NAN, 8) + q_admit() + REPAIR + q_admit() + q_compress(6),
    # NaN and Inf V scales (never read: accepted, moved with their tokens
    # bit for bit) and an extreme finite K scale (3.4e38: the dequantized
    # row overflows to inf in both caches alike), int4 paged, H2O.
    "seed-q-v-scale-nan": q_setup(1, True, int4=True, group=4, groups=2, tokens=(9, 11))
    + q_observe() + q_poke(0, 0, True, 1, NAN, 8) + q_poke(1, 1, True, 0, INF, 10) + q_observe(dense=2)
    + q_compress(8, paged=True) + q_poke(1, 0, False, 0, HUGE, 5) + q_append((1, 1)) + q_observe(lse=1)
    + q_compress(6, paged=True),
    # Library bug (found by this mode): compress accepted out.new_lengths
    # over cache.k_params (validate_output's overlap list names K and V,
    # the code buffers, not the parameter buffers it moves with them) and
    # wrote the new lengths over K scales. int8, Scissorhands, contiguous:
    # observe, then compress at 5 with that output.
    "regress-q-out-over-params": q_setup(0, False, group=4, groups=2, tokens=(6, 5)) + q_observe()
    + q_compress(5, dmg_out(False, True)),
    # Library bug (the same omission in validate_workspace_apart): compress
    # accepted a workspace over cache.v_params and wrote its scratch there.
    # int4, H2O, paged: observe, then compress at 5 with that workspace.
    "regress-q-workspace-over-params": q_setup(1, True, int4=True, group=4, groups=2, tokens=(6, 5)) + q_observe()
    + q_compress(5, dmg_ws(True), paged=True),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name, data in list(INPUTS.items()) + list(TL_INPUTS.items()) + list(Q_INPUTS.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(data))


if __name__ == "__main__":
    main()
