// libFuzzer harness for the host backend: this file only picks the mode from
// the first byte. Each mode decodes the rest of the input into a
// configuration (policy, shape, layout, paged or not, settings, the state's
// rows and capacity, which state row each batch position uses) and a short
// program of steps: the engine appends tokens, swaps batch positions,
// retires a request and starts another in its slot, rolls tokens back; the
// library observes (uniform or ragged queries), admits, compresses (the
// engine then applies compress_output: copies the new lengths, or rewrites
// its page table with shrink_page_table); the state is reset or garbage is
// poked into it; shrink_page_table is also called on its own random tables.
// After every library call the harness checks one of two outcomes:
//  - a scissorhands::invalid_argument naming the entry point and an
//    argument, and every byte the caller owns (cache, lengths, page table,
//    state, compress outputs, every scratch array) equal to a copy taken
//    before the call;
//  - success, and every invariant: cache untouched by observe; positions,
//    counts, steps and lengths as specified, per state row; the evicted set
//    equal to a brute-force oracle's; kept K/V rows and their state
//    bit-identical to the originals and in the slots the compaction mode
//    puts them; the lengths and page table never written; no other byte
//    written (state rows the batch does not map, slots past a length, output
//    entries outside the spans).
// The modes:
//  - per-head (mode_per_head.hpp, fuzz_case): any first byte not below;
//  - token-level eviction (mode_token_level.hpp; granularity.hpp): a first
//    byte in [97, 118] or [198, 217]: the per-head program with a
//    shared_heads policy (compress checked against one oracle per sequence,
//    by the score combined over the heads), or a shared_layers model of 1-3
//    layers driven through select, compact and forget (layers_case);
//  - quantized (fuzz_quantized.hpp, quant_case): a first byte in [161, 177],
//    a quantized cache (int8 / int4 codes with group parameters) and its
//    float twin through the same calls.
// decode.hpp holds the decoding every mode shares (bytes, settings, layouts),
// models.hpp the engine-side models and oracles.
// When the harness built a call from clean parts it knows the call is valid,
// and a refusal is a bug; when a part is invalid whatever else holds (a bad
// row, a short output, a length above the state's capacity, ...) an
// acceptance is a bug. Anything else (another exception, a sanitizer report,
// a crash) is a bug.
//
// Built two ways: with clang's -fsanitize=fuzzer (scripts/stages/20-fuzz.sh)
// and, with any compiler, linked with replay_main.cpp to re-run the corpus as
// a CTest test. FUZZ_TRACE=1 in the environment prints the decoded program.
#include <cstddef>
#include <cstdint>

#include "fuzz_quantized.hpp"
#include "mode_per_head.hpp"
#include "mode_token_level.hpp"

// The mode byte: the first. Token-level and quantized modes own ranges no
// input of the committed corpus started with when they were added, so every
// older input keeps its decoding; any other first byte is the per-head
// mode's first policy byte.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source src(data, size);
  const int first = size > 0 ? data[0] : -1;
  if ((first >= 97 && first <= 118) || (first >= 198 && first <= 217)) {
    src.byte();
    run_token_level_mode(src);
  } else if (first >= 161 && first <= 177) {
    src.byte();
    run_quantized_mode(src);
  } else {
    run_per_head_mode(src);
  }
  return 0;
}
