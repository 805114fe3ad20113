// The shared_layers compressors whose head reduction is mean (host::select + host::compact). compressor_factory.hpp.
#include "compressor_impl.hpp"

namespace llama::detail {

#define LLAMA_LAYERS_MEAN_MEAN(O, H, Q) LLAMA_MAKE_AT(O, H, Q, layers_mean_mean)
LLAMA_BASE_POLICIES(LLAMA_LAYERS_MEAN_MEAN)

#define LLAMA_LAYERS_MEAN_MAX(O, H, Q) LLAMA_MAKE_AT(O, H, Q, layers_mean_max)
LLAMA_BASE_POLICIES(LLAMA_LAYERS_MEAN_MAX)

}  // namespace llama::detail
