// The shared_layers compressors whose head reduction is max (host::select + host::compact). compressor_factory.hpp.
#include "compressor_impl.hpp"

namespace llama::detail {

#define LLAMA_LAYERS_MAX_MEAN(O, H, Q) LLAMA_MAKE_AT(O, H, Q, layers_max_mean)
LLAMA_BASE_POLICIES(LLAMA_LAYERS_MAX_MEAN)

#define LLAMA_LAYERS_MAX_MAX(O, H, Q) LLAMA_MAKE_AT(O, H, Q, layers_max_max)
LLAMA_BASE_POLICIES(LLAMA_LAYERS_MAX_MAX)

}  // namespace llama::detail
