// Compile-only: bridge.h on its own builds as strict C++17 with
// -fno-exceptions and every warning as an error, declares an instantiation,
// and holds plain data only. check_includes.cmake proves it pulls in no
// other library header.
#if __cplusplus != 201703L
#error "header_check.cpp must compile as C++17"
#endif
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#error "header_check.cpp must compile with -fno-exceptions"
#endif

#include <scissorhands/bridge/bridge.h>

#include <type_traits>

SCISSORHANDS_BRIDGE_DECLARE(header_check::nested::f32, float);
SCISSORHANDS_BRIDGE_DECLARE(header_check::u16, unsigned short);  // an engine's own 16-bit storage type

namespace br = scissorhands::bridge;

// What crosses the boundary is plain data with one layout for both sides.
template <class T>
constexpr bool plain = std::is_trivially_copyable_v<T>&& std::is_standard_layout_v<T>;
static_assert(plain<br::error> && plain<br::settings> && plain<br::kv_layout> && plain<br::paged_layout> &&
              plain<br::contiguous_cache<float>> && plain<br::paged_cache<float>> && plain<br::queries<float>> &&
              plain<br::lse> && plain<br::probabilities> && plain<br::state_shape> && plain<br::state> &&
              plain<br::compress_output> && plain<br::page_table>);
static_assert(
    std::is_same_v<decltype(header_check::nested::f32::compress(br::settings{}, br::paged_cache<float>{}, br::state{},
                                                                0, nullptr, 0, br::compress_output{})),
                   br::error>);
static_assert(noexcept(header_check::nested::f32::compress(br::settings{}, br::paged_cache<float>{}, br::state{}, 0,
                                                           nullptr, 0, br::compress_output{})));
static_assert(noexcept(header_check::u16::observe_queries(br::settings{}, header_check::u16::contiguous_cache{},
                                                          br::state{}, header_check::u16::queries{})));
static_assert(std::is_same_v<header_check::u16::element_type, unsigned short>);
// The layout helpers and length formulas are constexpr, as in the library.
static_assert(br::kv_layout::nhd(16, 2, 8).token_stride == 16 && br::paged_layout::hnd(4, 2, 8).head_stride == 32);
static_assert(br::length_after_compress(10, 10, 2) == 8 && br::length_after_compress(9, 10, 2) == 9);
static_assert(br::state_capacity_for(10, 7) == 16);

// Token level: its own namespace, plain descriptors, noexcept calls.
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(header_check::tokens);
static_assert(plain<br::token_table> && plain<br::model_state> && plain<br::selection>);
static_assert(noexcept(header_check::tokens::select(br::settings{}, br::token_table{}, br::model_state{}, 0, nullptr, 0,
                                                    br::selection{})));
static_assert(std::is_same_v<decltype(header_check::tokens::forget(br::settings{}, br::token_table{}, br::state{},
                                                                    br::selection{})),
                             br::error>);
static_assert(noexcept(header_check::tokens::select_workspace_bytes(br::token_table{}, br::state_shape{})));
static_assert(std::is_same_v<decltype(header_check::tokens::compact(br::settings{}, br::paged_cache<float>{},
                                                                     br::state{}, br::selection{}, nullptr, 0)),
                             br::error>);
static_assert(noexcept(header_check::tokens::compact(br::settings{}, br::paged_cache<br::fp16_bits>{}, br::state{},
                                                     br::selection{}, nullptr, 0)));
static_assert(std::is_same_v<decltype(header_check::tokens::compact_workspace_bytes(br::paged_cache<float>{})),
                             std::size_t> &&
              noexcept(header_check::tokens::compact_workspace_bytes(br::paged_cache<br::fp16_bits>{})));
static_assert(br::max_evictions(20, 16, 2) == 6 && br::max_evictions(10, 16, 2) == 0);
static_assert(br::model_state{}.for_batch(nullptr).layers == 0);
