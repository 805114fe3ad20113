// The compressors of a bf16 or int8/int4 cache: per_head, for the few
// policies LLAMA_LOW_PRECISION_POLICIES lists (compressor_factory.hpp), and
// their host::observe_*. The library is handed the stored rows (bf16
// elements, or codes with their parameters) and moves them itself.
#include "compressor_observe.hpp"

namespace llama::detail {

#define LLAMA_LOW_OBSERVE(O, H, Q, V)                                                                       \
  template void observe_layer<LLAMA_BASE_POLICY(O, H, Q), V>(const LLAMA_BASE_POLICY(O, H, Q)&, observe_source, \
                                                             V, sh::eviction_state<sh::memory_space::host>,     \
                                                             const attention_batch&);
#define LLAMA_LOW_BF16(O, H, Q) LLAMA_LOW_OBSERVE(O, H, Q, bf16_view) LLAMA_MAKE_AT_VIEW(O, H, Q, bf16_view)
#define LLAMA_LOW_QUANTIZED(O, H, Q) \
  LLAMA_LOW_OBSERVE(O, H, Q, quantized_view) LLAMA_MAKE_AT_VIEW(O, H, Q, quantized_view)
LLAMA_LOW_PRECISION_POLICIES(LLAMA_LOW_BF16)
LLAMA_LOW_PRECISION_POLICIES(LLAMA_LOW_QUANTIZED)

}  // namespace llama::detail
