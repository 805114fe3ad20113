# cmake -DCXX=<compiler> -DINCLUDE=<include dir> -DSOURCE=<tu including bridge.h> -P check_includes.cmake
# Lists the headers the TU pulls in (-M) and fails if any library header
# other than bridge/bridge.h is among them: the C++17 side must not depend
# on a C++20 header, even one that happens to compile as C++17 today.
execute_process(COMMAND ${CXX} -std=c++17 -fno-exceptions -I${INCLUDE} -M ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE deps ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "listing the headers of ${SOURCE} failed (${rc}):\n${err}")
endif()
string(REPLACE "\\\n" " " deps "${deps}")
string(REGEX REPLACE "[ \t\r\n]+" ";" deps "${deps}")
set(library_headers "")
foreach(dep IN LISTS deps)
  if(dep MATCHES "/scissorhands/.*\\.(h|hpp|cuh)$")
    list(APPEND library_headers "${dep}")
  endif()
endforeach()
list(LENGTH library_headers count)
if(NOT count EQUAL 1 OR NOT library_headers MATCHES "/scissorhands/bridge/bridge\\.h$")
  message(FATAL_ERROR "bridge.h must include no other scissorhands header; the C++17 TU includes:\n${library_headers}")
endif()
message("bridge.h includes no other scissorhands header")
