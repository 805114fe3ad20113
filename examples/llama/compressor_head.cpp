// The per_head compressors, and host::observe_* for every base policy
// (shared by every granularity). compressor_factory.hpp.
#include "compressor_observe.hpp"

namespace llama::detail {

#define LLAMA_OBSERVE(O, H, Q)                                                                                   \
  template void observe_layer<LLAMA_BASE_POLICY(O, H, Q), fp32_view>(                                           \
      const LLAMA_BASE_POLICY(O, H, Q)&, observe_source, fp32_view, sh::eviction_state<sh::memory_space::host>, \
      const attention_batch&);
LLAMA_BASE_POLICIES(LLAMA_OBSERVE)

#define LLAMA_PER_HEAD(O, H, Q) LLAMA_MAKE_AT(O, H, Q, sh::per_head)
LLAMA_BASE_POLICIES(LLAMA_PER_HEAD)

}  // namespace llama::detail
