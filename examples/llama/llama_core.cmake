# llama_core: the GGUF reader, tokenizer, model, engine and evaluation code
# shared by the scissorhands_llama CLI and tests/llama. Included from both
# folders (tests are configured first), hence the guard.
if(NOT TARGET llama_core)
  find_package(Threads REQUIRED)
  set(_llama_dir ${CMAKE_CURRENT_LIST_DIR})
  add_library(llama_core STATIC
    ${_llama_dir}/gguf.cpp
    ${_llama_dir}/tokenizer.cpp
    ${_llama_dir}/model.cpp
    ${_llama_dir}/context.cpp
    ${_llama_dir}/engine.cpp
    ${_llama_dir}/compressor.cpp
    ${_llama_dir}/compressor_head.cpp
    ${_llama_dir}/compressor_heads.cpp
    ${_llama_dir}/compressor_layers_mean.cpp
    ${_llama_dir}/compressor_layers_max.cpp
    ${_llama_dir}/compressor_low_precision.cpp
    ${_llama_dir}/kv_format.cpp
    ${_llama_dir}/evaluate.cpp
    ${_llama_dir}/persistence.cpp
    ${_llama_dir}/model_path.cpp)
  target_include_directories(llama_core PUBLIC ${_llama_dir})
  target_link_libraries(llama_core PUBLIC scissorhands::scissorhands Threads::Threads)
  target_compile_options(llama_core PRIVATE -Wall -Wextra -Wpedantic)
  # Where the default model (../shared/models beside the repository) and
  # scripts/plot_nll.sh are looked for.
  target_compile_definitions(llama_core PRIVATE SCISSORHANDS_REPO_ROOT="${PROJECT_SOURCE_DIR}")
endif()
