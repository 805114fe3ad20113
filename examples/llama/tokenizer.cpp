#include "tokenizer.hpp"

#include <cstdio>
#include <stdexcept>

#include "gguf.hpp"

namespace llama {

namespace {

const std::string space_marker = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Length of the UTF-8 sequence that starts with byte c (1 for stray bytes,
// which then fall back to their byte token).
std::size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

}  // namespace

tokenizer::tokenizer(const gguf_file& file) {
  pieces_ = file.get_string_array("tokenizer.ggml.tokens");
  const auto scores = file.get_number_array("tokenizer.ggml.scores");
  if (scores.size() != pieces_.size())
    throw gguf_error("tokenizer: tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                     " entries, tokenizer.ggml.tokens has " + std::to_string(pieces_.size()));
  scores_.assign(scores.begin(), scores.end());
  if (file.find("tokenizer.ggml.token_type")) {
    const auto types = file.get_number_array("tokenizer.ggml.token_type");
    if (types.size() != pieces_.size())
      throw gguf_error("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                       " entries, tokenizer.ggml.tokens has " + std::to_string(pieces_.size()));
    types_.assign(types.begin(), types.end());
  } else {
    types_.assign(pieces_.size(), 1);
  }
  const auto n = static_cast<std::uint64_t>(pieces_.size());
  const auto id = [&](const char* key, std::uint64_t fallback) {
    const std::uint64_t v = file.get_uint(key, fallback);
    if (v >= n) throw gguf_error(std::string("tokenizer: ") + key + " = " + std::to_string(v) + " is not below the vocabulary size " + std::to_string(n));
    return static_cast<std::int32_t>(v);
  };
  bos_ = id("tokenizer.ggml.bos_token_id", 1);
  eos_ = id("tokenizer.ggml.eos_token_id", 2);
  unknown_ = id("tokenizer.ggml.unknown_token_id", 0);
  build_index();
}

tokenizer::tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<std::int32_t> types,
                     std::int32_t bos, std::int32_t eos)
    : pieces_(std::move(pieces)), scores_(std::move(scores)), types_(std::move(types)), bos_(bos), eos_(eos) {
  if (scores_.size() != pieces_.size() || types_.size() != pieces_.size())
    throw std::invalid_argument("tokenizer: pieces, scores and types must have the same length");
  build_index();
}

void tokenizer::build_index() {
  for (auto& b : byte_token_) b = -1;
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const std::string& p = pieces_[i];
    // Byte pieces are "<0xXX>"; they stay out of the merge index.
    unsigned value = 0;
    if (types_[i] == 6 && p.size() == 6 && std::sscanf(p.c_str(), "<0x%02X>", &value) == 1 && value < 256) {
      byte_token_[value] = static_cast<std::int32_t>(i);
      continue;
    }
    if (types_[i] == 3) continue;  // control tokens (<s>, </s>) are never produced by merging
    index_.emplace(p, static_cast<std::int32_t>(i));
  }
}

std::vector<std::int32_t> tokenizer::encode(const std::string& text, bool bos) const {
  std::vector<std::int32_t> out;
  if (bos) out.push_back(bos_);
  if (text.empty()) return out;
  std::string s = space_marker;
  for (char c : text) {
    if (c == ' ')
      s += space_marker;
    else
      s += c;
  }
  // One token per character, or its bytes when the character is unknown.
  std::vector<std::int32_t> tokens;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
    auto it = index_.find(s.substr(i, len));
    if (it != index_.end()) {
      tokens.push_back(it->second);
    } else {
      for (std::size_t k = 0; k < len; ++k) {
        const std::int32_t b = byte_token_[static_cast<unsigned char>(s[i + k])];
        tokens.push_back(b >= 0 ? b : unknown_);
      }
    }
    i += len;
  }
  // Merge the best-scoring adjacent pair until no pair forms a piece; ties
  // go to the leftmost pair.
  std::string merged;
  for (;;) {
    float best = -1e30f;
    std::int32_t best_id = -1;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
      merged = pieces_[static_cast<std::size_t>(tokens[i])];
      merged += pieces_[static_cast<std::size_t>(tokens[i + 1])];
      auto it = index_.find(merged);
      if (it != index_.end() && scores_[static_cast<std::size_t>(it->second)] > best) {
        best = scores_[static_cast<std::size_t>(it->second)];
        best_id = it->second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_at] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  out.insert(out.end(), tokens.begin(), tokens.end());
  return out;
}

std::string tokenizer::piece_text(std::int32_t previous, std::int32_t token) const {
  if (token < 0 || token >= size()) throw std::out_of_range("tokenizer: token id " + std::to_string(token) + " is not in [0, " + std::to_string(size()) + ")");
  const auto t = static_cast<std::size_t>(token);
  if (types_[t] == 3) return {};
  if (types_[t] == 6) {
    unsigned value = 0;
    if (std::sscanf(pieces_[t].c_str(), "<0x%02X>", &value) == 1) return std::string(1, static_cast<char>(value));
  }
  std::string out;
  const std::string& p = pieces_[t];
  for (std::size_t i = 0; i < p.size();) {
    if (p.compare(i, space_marker.size(), space_marker) == 0) {
      out += ' ';
      i += space_marker.size();
    } else {
      out += p[i++];
    }
  }
  // The space encode prepended to the text: dropped after BOS and at the start.
  if ((previous < 0 || previous == bos_) && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string tokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  std::string out;
  std::int32_t previous = -1;
  for (std::int32_t t : tokens) {
    out += piece_text(previous, t);
    previous = t;
  }
  return out;
}

}  // namespace llama
