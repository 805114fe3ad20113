// The llama example's KV storage formats without a model (kv_format.hpp):
// --kv-bits / --kv-group resolution and its refusals, the bytes per row,
// the bf16 rounding, and an engine over a small random-weight model whose
// int8 / int4 / bf16 cache the library compresses (codes and parameters
// move with their tokens' state).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "compressor.hpp"
#include "engine.hpp"
#include "evaluate.hpp"
#include "kv_format.hpp"
#include "model.hpp"

namespace {

namespace sh = scissorhands;
using namespace llama;

model small_model() {
  const model_config c{
      .dim = 64, .layers = 2, .q_heads = 8, .kv_heads = 4, .head_dim = 8, .hidden = 96, .vocab = 64, .context = 256};
  return model::random(c, 3);
}

}  // namespace

TEST_CASE("kv format: --kv-bits and --kv-group resolve, or are refused naming the option", "[kv_format]") {
  const kv_format f32 = resolve_kv_format(32, 0, 16);
  CHECK(f32.name() == "fp32");
  CHECK(f32.row_bytes() == 64);
  CHECK(f32.param_row_bytes() == 0);
  const kv_format b16 = resolve_kv_format(16, 0, 16);
  CHECK(b16.name() == "bf16");
  CHECK(b16.row_bytes() == 32);
  // The default group: 32, or head_dim when narrower.
  CHECK(resolve_kv_format(8, 0, 16).group_size == 16);
  CHECK(resolve_kv_format(8, 0, 128).group_size == 32);
  const kv_format i8 = resolve_kv_format(8, 8, 16);
  CHECK(i8.name() == "int8/g8");
  CHECK(i8.row_bytes() == 16);
  CHECK(i8.param_row_bytes() == 2 * 4);  // a scale per group
  const kv_format i4 = resolve_kv_format(4, 0, 16);
  CHECK(i4.name() == "int4/g16");
  CHECK(i4.row_bytes() == 8);
  CHECK(i4.param_row_bytes() == 2 * 4);  // a scale and an offset

  CHECK_THROWS_WITH(resolve_kv_format(7, 0, 16),
                    "--kv-bits must be 32 (fp32), 16 (bf16), 8 (int8 codes) or 4 (int4 codes), got 7");
  CHECK_THROWS_WITH(resolve_kv_format(8, 6, 16), Catch::Contains("--kv-group 6 must divide the model's head_dim = 16"));
  CHECK_THROWS_WITH(resolve_kv_format(4, 32, 16), Catch::Contains("--kv-group 32 must divide the model's head_dim = 16"));
  CHECK_THROWS_WITH(resolve_kv_format(4, 1, 16), Catch::Contains("--kv-group 1 must be even with --kv-bits 4"));
  CHECK_THROWS_WITH(resolve_kv_format(16, 8, 16), Catch::Contains("--kv-group 8 applies to --kv-bits 8 or 4 only"));
  CHECK_THROWS_WITH(resolve_kv_format(32, 8, 16), Catch::Contains("--kv-group 8 applies to --kv-bits 8 or 4 only"));
}

TEST_CASE("kv format: bf16 rounds to nearest even", "[kv_format]") {
  CHECK(from_bf16(to_bf16(1.0f)) == 1.0f);
  CHECK(from_bf16(to_bf16(-2.5f)) == -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.
  CHECK(from_bf16(to_bf16(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(from_bf16(to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  CHECK(from_bf16(to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(sh::to_float(to_bf16(0.15625f)) == 0.15625f);
}

TEST_CASE("kv format: the engine stores each format, and compress moves its rows with their state", "[kv_format]") {
  const model m = small_model();
  const model_config& c = m.config;
  const auto text = sample_texts(m, 1, 96, 4, 1.0f, 1.0f).front().tokens;
  const std::int32_t B = 20;
  for (std::int32_t bits : {16, 8, 4}) {
    for (const char* name : {"scissorhands", "h2o:m=3"}) {
      for (auto source : {observe_source::probabilities, observe_source::queries}) {
        INFO("--kv-bits " << bits << ", policy " << name
                          << (source == observe_source::queries ? " (observe_queries)" : ""));
        const policy_spec spec = parse_policy(name);
        engine e(m, static_cast<std::int32_t>(text.size()), sh::named_layout::hnd, kv_format{bits, 0, 0});
        REQUIRE(e.format().bits == bits);
        e.set_policy(&spec, std::vector<std::int32_t>(static_cast<std::size_t>(c.layers), B), source);
        CHECK_THROWS_AS(e.view(0), std::logic_error);  // not fp32
        // The stored bytes of every slot, as appended, per (layer, head, position).
        const auto stored_row = [&](std::int32_t layer, std::int32_t h, std::int32_t slot) {
          std::vector<unsigned char> bytes;
          std::visit(
              [&](const auto& v) {
                using V = std::decay_t<decltype(v)>;
                const auto add = [&](const void* p, std::size_t n) {
                  const auto* b = static_cast<const unsigned char*>(p);
                  bytes.insert(bytes.end(), b, b + n);
                };
                if constexpr (std::is_same_v<V, sh::host_quantized_kv_view>) {
                  add(v.k_row(0, h, slot), static_cast<std::size_t>(v.code_row_bytes()));
                  add(v.v_row(0, h, slot), static_cast<std::size_t>(v.code_row_bytes()));
                  add(v.k_params_row(0, h, slot), sizeof(float) * static_cast<std::size_t>(v.params_per_row()));
                  add(v.v_params_row(0, h, slot), sizeof(float) * static_cast<std::size_t>(v.params_per_row()));
                } else {
                  add(v.k_row(0, h, slot), sizeof(*v.k_row(0, h, slot)) * static_cast<std::size_t>(v.head_dim));
                  add(v.v_row(0, h, slot), sizeof(*v.v_row(0, h, slot)) * static_cast<std::size_t>(v.head_dim));
                }
              },
              e.cache(layer));
          return bytes;
        };
        std::map<std::tuple<int, int, int>, std::vector<unsigned char>> appended;
        std::int32_t max_len = 0;
        e.on_attention = [&](std::int32_t layer, const float*, std::int32_t len) {
          max_len = std::max(max_len, len);
          for (std::int32_t h = 0; h < c.kv_heads; ++h) appended[{layer, h, e.position()}] = stored_row(layer, h, len - 1);
        };
        bool moved_together = true;
        for (std::size_t t = 0; t + 1 < text.size(); ++t) {
          e.step(text[t]);
          for (std::int32_t layer = 0; layer < c.layers; ++layer) {
            const auto st = e.compressor()->state(layer);
            for (std::int32_t h = 0; h < c.kv_heads; ++h)
              for (std::int32_t s = 0; s < e.length(layer); ++s)
                moved_together = moved_together &&
                                 appended[{layer, h, st.positions[st.index(0, h, s)]}] == stored_row(layer, h, s);
          }
        }
        CHECK(moved_together);
        CHECK(max_len == B);
        // Bytes: the values or codes, and the parameters, of B slots per head and layer.
        const auto slots = static_cast<std::size_t>(c.layers) * static_cast<std::size_t>(c.kv_heads) * B;
        CHECK(e.kv_bytes() == 2 * slots * static_cast<std::size_t>(e.format().row_bytes()));
        CHECK(e.param_bytes() == 2 * slots * static_cast<std::size_t>(e.format().param_row_bytes()));
        CHECK(e.state_slot_bytes() <= e.state_bytes());
      }
    }
  }
}

TEST_CASE("kv format: a policy not built for a quantized cache is refused", "[kv_format]") {
  const model m = small_model();
  const std::vector<std::int32_t> budgets(static_cast<std::size_t>(m.config.layers), 16);
  for (const char* name : {"tova", "streaming", "scissorhands-important", "h2o:gran=heads"}) {
    INFO(name);
    const policy_spec spec = parse_policy(name);
    CHECK_FALSE(runs_on(spec, resolve_kv_format(8, 0, 8)));
    CHECK(runs_on(spec, resolve_kv_format(32, 0, 8)));
    engine e(m, 64, sh::named_layout::nhd, kv_format{8, 0, 0});
    CHECK_THROWS_WITH(e.set_policy(&spec, budgets), Catch::Contains("is not built for --kv-bits 8"));
  }
  for (const char* name : {"scissorhands", "scissorhands-paper", "h2o", "h2o:norm=1", "snapkv"}) {
    INFO(name);
    CHECK(runs_on(parse_policy(name), resolve_kv_format(4, 0, 8)));
  }
}

TEST_CASE("kv format: evaluate_grid reports the stored bytes and the fp32 reference", "[kv_format]") {
  const model m = small_model();
  const auto texts = sample_texts(m, 1, 64, 9, 1.0f, 1.0f);
  const std::vector<policy_spec> specs{parse_policy("scissorhands")};
  eval_options o;
  o.threads = 2;
  const auto fp32 = evaluate_grid(m, texts, specs, {16, 32}, o);
  o.format = kv_format{32, 0, 0};
  const auto fp32_explicit = evaluate_grid(m, texts, specs, {16, 32}, o);
  REQUIRE(fp32.size() == 3);
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    CHECK(fp32_explicit[i].nll() == fp32[i].nll());
    CHECK(fp32[i].nll_fp32 == fp32.front().nll());
    CHECK(fp32[i].param_bytes == 0.0);
  }
  for (std::int32_t bits : {16, 8, 4}) {
    INFO("--kv-bits " << bits);
    o.format = kv_format{bits, 0, 0};
    const auto r = evaluate_grid(m, texts, specs, {16, 32}, o);
    REQUIRE(r.size() == fp32.size());  // the fp32 reference is not a row
    for (std::size_t i = 0; i < r.size(); ++i) {
      CHECK(r[i].kv_bits == bits);
      CHECK(r[i].nll_fp32 == fp32.front().nll());
      CHECK(std::isfinite(r[i].nll()));
      CHECK(r[i].kv_bytes + r[i].param_bytes < fp32[i].kv_bytes);
      CHECK(r[i].state_bytes == fp32[i].state_bytes);
      CHECK(r[i].total_bytes() < fp32[i].total_bytes());
    }
  }
}
