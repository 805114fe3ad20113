# cmake -DSOURCE=<consumer> -DBINARY=<build tree> -DWORK=<scratch> -DCXX=<compiler>
#       [-DLAUNCHER=<ccache>] [-DGENERATOR=<generator>] [-DVERSION=<x.y.z>] -P run.cmake
foreach(var SOURCE BINARY WORK CXX)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

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

set(configure_args -S ${SOURCE} -B ${WORK}/build -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX}
                   -DCMAKE_BUILD_TYPE=Release -DEXPECTED_PREFIX=${prefix})
if(GENERATOR)
  list(APPEND configure_args -G ${GENERATOR})
endif()
if(LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
if(VERSION)
  list(APPEND configure_args -DEXPECTED_VERSION=${VERSION})
endif()
run_step("configuring the consumer" ${CMAKE_COMMAND} ${configure_args})
run_step("building the consumer" ${CMAKE_COMMAND} --build ${WORK}/build)
find_program(consumer NAMES consumer PATHS ${WORK}/build NO_DEFAULT_PATH REQUIRED)
run_step("running the consumer" ${consumer})
message("${step_output}")
