# cmake -DSOURCE=<consumer> -DBINARY=<build tree> -DWORK=<scratch> -DCXX=<compiler>
#       [-DLAUNCHER=<ccache>] [-DGENERATOR=<generator>] [-DVERSION=<x.y.z>]
#       [-DSUBDIRECTORY=<scissorhands source>] [-DCXX_STANDARD=<17|20>]
#       [-DCUDA=<nvcc> [-DCUDA_LAUNCHER=<ccache>] [-DCUDA_HOST=<host compiler>]
#        [-DCUDA_ARCHITECTURES=<arch>]] [-DBUILD_ONLY=ON -DNAME=<test>] -P run.cmake
# Without SUBDIRECTORY: installs BINARY into a fresh prefix and points the
# consumer's find_package at it. With it: the consumer add_subdirectory()s
# that source tree instead. BUILD_ONLY: configure and build the consumer,
# run nothing, and print "<NAME>: built".
foreach(var SOURCE BINARY WORK CXX)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(BUILD_ONLY AND "${NAME}" STREQUAL "")
  message(FATAL_ERROR "run.cmake: -DBUILD_ONLY=ON needs -DNAME=...")
endif()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# A fresh prefix every run, so a stale install cannot make the test pass.
set(prefix ${WORK}/prefix)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

set(configure_args -S ${SOURCE} -B ${WORK}/build -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release)
if(SUBDIRECTORY)
  list(APPEND configure_args -DSCISSORHANDS_SOURCE=${SUBDIRECTORY})
else()
  run_step("cmake --install" ${CMAKE_COMMAND} --install ${BINARY} --prefix ${prefix})

  # What the package must contain.
  file(GLOB_RECURSE config_files ${prefix}/*/scissorhands-config.cmake)
  file(GLOB_RECURSE version_files ${prefix}/*/scissorhands-config-version.cmake)
  file(GLOB_RECURSE target_files ${prefix}/*/scissorhands-targets.cmake)
  foreach(f config_files version_files target_files)
    if(NOT ${f})
      message(FATAL_ERROR "the install prefix lacks the package file for ${f}")
    endif()
  endforeach()
  foreach(h scissorhands.hpp kv_view.hpp host/compress.hpp policy/eviction_policy.hpp bridge/bridge.h
            bridge/bridge_impl.hpp)
    if(NOT EXISTS ${prefix}/include/scissorhands/${h})
      message(FATAL_ERROR "the install prefix lacks include/scissorhands/${h}")
    endif()
  endforeach()
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${prefix} -DEXPECTED_PREFIX=${prefix})
endif()

if(GENERATOR)
  list(APPEND configure_args -G ${GENERATOR})
endif()
if(LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
if(VERSION)
  list(APPEND configure_args -DEXPECTED_VERSION=${VERSION})
endif()
if(CXX_STANDARD)
  list(APPEND configure_args -DCONSUMER_CXX_STANDARD=${CXX_STANDARD})
endif()
if(CUDA)
  list(APPEND configure_args -DCMAKE_CUDA_COMPILER=${CUDA})
  if(CUDA_LAUNCHER)
    list(APPEND configure_args -DCMAKE_CUDA_COMPILER_LAUNCHER=${CUDA_LAUNCHER})
  endif()
  if(CUDA_HOST)
    list(APPEND configure_args -DCMAKE_CUDA_HOST_COMPILER=${CUDA_HOST})
  endif()
  if(CUDA_ARCHITECTURES)
    list(APPEND configure_args -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES})
  endif()
endif()
run_step("configuring the consumer" ${CMAKE_COMMAND} ${configure_args})
run_step("building the consumer" ${CMAKE_COMMAND} --build ${WORK}/build)
if(BUILD_ONLY)
  message("${NAME}: built")
else()
  find_program(consumer NAMES consumer PATHS ${WORK}/build NO_DEFAULT_PATH REQUIRED)
  run_step("running the consumer" ${consumer})
  message("${step_output}")
endif()
