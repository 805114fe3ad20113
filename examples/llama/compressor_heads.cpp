// The shared_heads compressors (host::compress, one choice per layer). compressor_factory.hpp.
#include "compressor_impl.hpp"

namespace llama::detail {

#define LLAMA_HEADS_MEAN(O, H, Q) LLAMA_MAKE_AT(O, H, Q, heads_mean)
LLAMA_BASE_POLICIES(LLAMA_HEADS_MEAN)

#define LLAMA_HEADS_MAX(O, H, Q) LLAMA_MAKE_AT(O, H, Q, heads_max)
LLAMA_BASE_POLICIES(LLAMA_HEADS_MAX)

}  // namespace llama::detail
