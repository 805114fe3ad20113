#include "model_path.hpp"

#include <cstdlib>
#include <filesystem>
#include <sstream>

#ifndef SCISSORHANDS_REPO_ROOT
#define SCISSORHANDS_REPO_ROOT "."
#endif

namespace llama {

namespace fs = std::filesystem;

std::string repo_root() { return SCISSORHANDS_REPO_ROOT; }

model_location find_model(const std::string& explicit_path) {
  model_location where;
  std::vector<std::string> candidates;
  if (!explicit_path.empty()) {
    where.source = "--model";
    candidates.push_back(explicit_path);
  } else if (const char* env = std::getenv(model_env_var); env && *env) {
    where.source = std::string("$") + model_env_var;
    candidates.push_back(env);
  } else {
    where.source = "default";
    candidates.push_back((fs::path(repo_root()) / default_model_relative).lexically_normal().string());
    candidates.push_back(fs::path(default_model_relative).string());
  }
  for (const auto& c : candidates) {
    where.tried.push_back(c);
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) {
      where.path = c;
      break;
    }
  }
  return where;
}

std::string find_shared_model(const std::string& file_name) {
  const fs::path dir = fs::path(default_model_relative).parent_path();
  for (const fs::path& c : {(fs::path(repo_root()) / dir / file_name).lexically_normal(), dir / file_name}) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c.string();
  }
  return {};
}

std::string missing_model_help(const model_location& where) {
  std::ostringstream o;
  o << "No model file found (" << where.source << "); tried:\n";
  for (const auto& t : where.tried) o << "  " << t << "\n";
  o << "To get the model this example expects:\n"
       "  1. Download stories260K (model + tokenizer) from Andrej Karpathy's tinyllamas on Hugging Face\n"
       "     (karpathy/tinyllamas, folder stories260K: stories260K.bin and tok512.bin; MIT licence).\n"
       "  2. Convert it to GGUF with llama.cpp's convert-llama2c-to-ggml example (all tensors F32),\n"
       "     or take an existing stories260K.gguf (a 1.18 MB Llama-2 GGUF v3 file, 512-token vocabulary).\n"
       "  3. Put it at <repo>/../shared/models/stories260K.gguf, i.e. "
    << (fs::path(repo_root()) / default_model_relative).lexically_normal().string()
    << "\n     or pass --model PATH, or set " << model_env_var << "=PATH.\n"
       "Never commit the model to the repository.\n";
  return o.str();
}

}  // namespace llama
