#pragma once
// Where the model is: --model, then $SCISSORHANDS_MODEL, then the default
// ../shared/models/stories260K.gguf next to the repository (resolved from
// the source tree the binary was built from, then from the working
// directory). What to do when none is there is spelled out by
// missing_model_help().
#include <string>
#include <vector>

namespace llama {

inline constexpr const char* model_env_var = "SCISSORHANDS_MODEL";
inline constexpr const char* default_model_relative = "../shared/models/stories260K.gguf";

struct model_location {
  std::string path;                // the file found; empty when none was
  std::vector<std::string> tried;  // every candidate, in order
  std::string source;              // "--model", "$SCISSORHANDS_MODEL" or "default"
};

// `explicit_path` is --model (may be empty). An explicit path or the
// environment variable is the only candidate when given: a typo must not
// silently fall back to another model.
model_location find_model(const std::string& explicit_path);
// Step-by-step instructions naming every path tried.
std::string missing_model_help(const model_location& where);
// ../shared/models/<file_name> beside the repository (from the source tree,
// then from the working directory): the path found, or empty.
std::string find_shared_model(const std::string& file_name);
// The repository this binary was built from (for scripts/plot_nll.sh).
std::string repo_root();

}  // namespace llama
