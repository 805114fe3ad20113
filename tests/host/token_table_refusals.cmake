# cmake -DCXX=<compiler> -DINCLUDE=<include dir> -DSOURCE=<token_table_refusal.cpp> -P token_table_refusals.cmake
# The calls that need K/V must not compile with a token_table_view, and the
# first error must be the library's static_assert naming the call: each case
# of the source is compiled alone (-fsyntax-only). The source without a case
# must compile, so a failure is the refusal and not a broken set-up.
set(flags -std=c++20 -fsyntax-only -I${INCLUDE})
execute_process(COMMAND ${CXX} ${flags} -DREFUSE=0 ${SOURCE} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the refusal TU does not compile without a refused call:\n${err}")
endif()
set(expected
  "host::observe_queries recomputes attention from the cached keys"
  "host::plan_observe_queries recomputes attention from the cached keys"
  "host::compress moves K/V rows and a token_table_view holds none"
  "host::plan_compress moves K/V rows and a token_table_view holds none"
  "host::compact moves K/V rows and a token_table_view holds none"
  "host::plan_compact moves K/V rows and a token_table_view holds none"
  "scores each token from its K row when admitting it"
  "scores each token from its K row when admitting it")
set(n 0)
foreach(message IN LISTS expected)
  math(EXPR n "${n} + 1")
  execute_process(COMMAND ${CXX} ${flags} -DREFUSE=${n} ${SOURCE} RESULT_VARIABLE rc ERROR_VARIABLE err)
  string(FIND "${err}" "error:" first_error)
  string(FIND "${err}" "${message}" at)
  if(rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "case ${n}: expected a refusal with \"${message}\", got (${rc}):\n${err}")
  endif()
  # Only the static_assert: no cascade of errors from the body.
  string(REGEX MATCHALL "error:" errors "${err}")
  list(LENGTH errors count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "case ${n}: ${count} errors, expected the static_assert alone:\n${err}")
  endif()
endforeach()
message("token_table_view refused by all ${n} K/V calls")
