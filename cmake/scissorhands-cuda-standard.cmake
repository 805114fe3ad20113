# How scissorhands::cuda asks for CUDA C++20 (its .cuh headers need it).
#
# Included, in the consumer's variable scope, where scissorhands::cuda
# becomes visible: by CMakeLists.txt (add_subdirectory) and by the installed
# package's scissorhands-config.cmake (find_package). So the consumer's
# CMake decides, not the one that installed the package: a package
# installed by CMake >= 3.26 must still work from CMake 3.25, and the other
# way round.
#
# Sets _scissorhands_cuda_std to what scissorhands::cuda must carry in
# INTERFACE_COMPILE_FEATURES, and _scissorhands_cuda_std_option to what it
# must carry in INTERFACE_COMPILE_OPTIONS (either may be empty), and
# _scissorhands_cuda_std_taught when it taught CMake 3.25 nvcc's flag.
#
# - CMake knows cuda_std_20 for this compiler (3.26+ with nvcc >= 12,
#   or a compiler CMake 3.25 already knew C++20 flags for):
#   the plain feature. It raises every target that links scissorhands::cuda
#   to CUDA C++20, whatever its CUDA_STANDARD or CXX_STANDARD (required or
#   not), as cxx_std_20 raises a C++17 target.
#
# - CMake 3.25 with nvcc >= 12: CMake lacks nvcc's C++20 flag. A target
#   with no CUDA_STANDARD takes its CXX_STANDARD for CUDA too, and that is
#   20 once scissorhands::scissorhands's cxx_std_20 applies; with
#   CMAKE_CXX_STANDARD_REQUIRED ON, CMake then stopped with 'requires the
#   language dialect "CUDA20"' (issue 43). So we give CMake the flag that
#   3.26's Compiler/NVIDIA-CUDA.cmake has (-std=c++20), as cache entries,
#   which every directory sees. A target that sets a CUDA_STANDARD below 20
#   itself (CMAKE_CUDA_STANDARD 17, as ggml-cuda does) is raised by the
#   cuda_std_20 feature, which CMake 3.25 accepts only in a directory whose
#   CMAKE_CUDA_COMPILE_FEATURES lists it: we add it here, in the scope of
#   the find_package call or (add_subdirectory) in the including directory,
#   and the directories added below them after that. Elsewhere such a
#   target stops at generation with 'The compiler feature "cuda_std_20" is
#   not known to CUDA compiler': give it CUDA_STANDARD 20, or upgrade CMake.
#
# - Otherwise (e.g. nvcc < 12, which has no C++20): -std=c++20 as a plain
#   option, as before; nvcc says it does not know it.
set(_scissorhands_cuda_std "")
set(_scissorhands_cuda_std_option "")
set(_scissorhands_cuda_std_taught OFF)
if(CMAKE_VERSION VERSION_LESS 3.26 AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
   AND (NOT CMAKE_CUDA_SIMULATE_ID STREQUAL "MSVC" OR CMAKE_CUDA_SIMULATE_VERSION VERSION_GREATER_EQUAL 19.11.25505))
  foreach(_sh_kind STANDARD EXTENSION)
    if(NOT DEFINED CMAKE_CUDA20_${_sh_kind}_COMPILE_OPTION)
      set(CMAKE_CUDA20_${_sh_kind}_COMPILE_OPTION "-std=c++20" CACHE INTERNAL
          "nvcc's CUDA C++20 flag, which CMake < 3.26 lacks (set by scissorhands)")
    endif()
  endforeach()
  unset(_sh_kind)
  set(_scissorhands_cuda_std_taught ON)
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  endif()
  # Only for a target whose own CUDA_STANDARD is below 20; the others get
  # 20 from their CXX standard, in any directory.
  set(_scissorhands_cuda_std
      "$<$<AND:$<BOOL:$<TARGET_PROPERTY:CUDA_STANDARD>>,$<VERSION_LESS:$<TARGET_PROPERTY:CUDA_STANDARD>,20>>:cuda_std_20>")
elseif("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
  set(_scissorhands_cuda_std cuda_std_20)
else()
  set(_scissorhands_cuda_std_option "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>")
endif()
