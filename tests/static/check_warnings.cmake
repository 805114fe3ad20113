# cmake -DCXX=<clang++> -DINCLUDE=<include dir> -DDIR=<tests/static> [-DMARCHES=<isa,...>] -P check_warnings.cmake
# The headers compile with no warning under -Wall -Wextra -Wconversion
# (clang's includes -Wsign-conversion), their templates instantiated
# (tidy_tu.cpp) and every public .hpp included (all_headers_tu.cpp), once
# per -march in MARCHES (observe's dot products take another path with AVX).
# Fails first if a header under include/scissorhands is missing from
# all_headers_tu.cpp.
file(GLOB_RECURSE headers RELATIVE "${INCLUDE}" "${INCLUDE}/scissorhands/*.hpp")
file(READ "${DIR}/all_headers_tu.cpp" listed)
set(missing "")
foreach(header IN LISTS headers)
  string(FIND "${listed}" "#include <${header}>" at)
  if(at EQUAL -1)
    list(APPEND missing "${header}")
  endif()
endforeach()
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "tests/static/all_headers_tu.cpp does not include:\n  ${missing}")
endif()

# "-": the compiler's default -march, when MARCHES names none.
set(runs "-")
if(MARCHES)
  string(REPLACE "," ";" runs "${MARCHES}")
endif()
set(flags -std=c++20 -fsyntax-only -Werror -Wall -Wextra -Wconversion -I${INCLUDE})
foreach(source IN ITEMS tidy_tu.cpp all_headers_tu.cpp)
  foreach(march IN LISTS runs)
    set(isa "")
    if(NOT march STREQUAL "-")
      set(isa -march=${march})
    endif()
    execute_process(COMMAND ${CXX} ${flags} ${isa} ${DIR}/${source} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      string(JOIN " " command ${CXX} ${flags} ${isa} ${source})
      message(FATAL_ERROR "${command} failed (${rc}):\n${out}")
    endif()
    message("${source} ${isa}: no warnings")
  endforeach()
endforeach()
