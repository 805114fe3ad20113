#pragma once
// The SentencePiece-style BPE tokenizer stored in a llama GGUF
// (tokenizer.ggml.tokens / scores / token_type). Encoding follows the llama
// SentencePiece convention: spaces become U+2581 "▁", one "▁" is prepended
// to the text, the text is split into UTF-8 characters (a character not in
// the vocabulary becomes its bytes' <0xXX> tokens), then the adjacent pair
// whose merged piece has the highest score is merged until none is left.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace llama {

class gguf_file;

class tokenizer {
 public:
  explicit tokenizer(const gguf_file& file);
  // For tests and the synthetic demo: pieces, scores and types given directly.
  tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<std::int32_t> types,
            std::int32_t bos, std::int32_t eos);

  // Token ids of `text`, with BOS first when `bos` is set.
  std::vector<std::int32_t> encode(const std::string& text, bool bos = true) const;
  // Text of a token sequence: control tokens vanish, byte tokens become
  // their byte, and the space of the "▁" prepended by encode is dropped
  // from the first piece of each run that follows BOS (or starts the list).
  std::string decode(const std::vector<std::int32_t>& tokens) const;
  // Text of one token following `previous` (for streaming output).
  std::string piece_text(std::int32_t previous, std::int32_t token) const;

  std::int32_t bos() const { return bos_; }
  std::int32_t eos() const { return eos_; }
  std::int32_t size() const { return static_cast<std::int32_t>(pieces_.size()); }
  const std::string& piece(std::int32_t id) const { return pieces_.at(static_cast<std::size_t>(id)); }

 private:
  void build_index();

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<std::int32_t> types_;  // 1 normal, 2 unknown, 3 control, 6 byte (llama.cpp's numbering)
  std::unordered_map<std::string, std::int32_t> index_;
  std::int32_t byte_token_[256];     // id of <0xXX>, or -1
  std::int32_t bos_ = 1;
  std::int32_t eos_ = 2;
  std::int32_t unknown_ = 0;
};

}  // namespace llama
