#pragma once
// Umbrella header of the host-safe library: views, policies and the host
// backend. Compiles with a plain C++20 compiler; never includes CUDA.
#include "attention_view.hpp"
#include "compress_output.hpp"
#include "config.hpp"
#include "element.hpp"
#include "error.hpp"
#include "eviction_state.hpp"
#include "host/compress.hpp"
#include "host/observe.hpp"
#include "host/state.hpp"
#include "kv_layout.hpp"
#include "kv_view.hpp"
#include "paged_kv_view.hpp"
#include "policy/budget.hpp"
#include "policy/concepts.hpp"
#include "policy/eviction_policy.hpp"
#include "span.hpp"
