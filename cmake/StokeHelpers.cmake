# Helpers that keep each folder's CMakeLists.txt to a few lines.
#
#   stoke_library(NAME SRCS a.cc b.cc DEPS other_lib ...)   one static library per folder
#   stoke_test(NAME SRCS a_test.cc DEPS lib ... [LABELS l] [REAL regex])
#                                                           one GoogleTest binary, registered with ctest; the
#                                                           tests whose names match REAL get the label `real` too
#   stoke_fuzzer(NAME SRCS f.cc DEPS lib ...)                a libFuzzer target (only with STOKE_FUZZ)

set(STOKE_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers)

if(STOKE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(STOKE_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
if(STOKE_FUZZ)
  add_custom_target(stoke_fuzzers)  # builds every fuzzer and nothing else
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()

# x86-64-v3 (AVX2/FMA/F16C) is the portable baseline for the CPU kernels: every server x86 CPU of the
# last decade has it; STOKE_NATIVE=ON tunes further for the build machine.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  if(STOKE_NATIVE)
    set(STOKE_ARCH_FLAGS -march=native)
  else()
    set(STOKE_ARCH_FLAGS -march=x86-64-v3)
  endif()
endif()

# Every test binary labelled `unit`: the ASan + UBSan stage builds this target only (not the CLI, benches and
# tools no unit test links), since it runs `ctest -L unit` alone.
add_custom_target(stoke_unit_tests)

function(stoke_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${STOKE_WARNINGS} ${STOKE_ARCH_FLAGS}>)
endfunction()

function(stoke_test name)
  cmake_parse_arguments(ARG "" "REAL" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${name} PRIVATE ${STOKE_WARNINGS} ${STOKE_ARCH_FLAGS})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
  if("unit" IN_LIST ARG_LABELS)
    add_dependencies(stoke_unit_tests ${name})
  endif()
  if(ARG_REAL)
    # Label `real`: long runs of a real model (SmolLM2 loops, the precision gate on it). They run in the release
    # ctest; scripts/test.sh leaves them out of the ASan + UBSan run (-LE real), where -O0 + ASan makes each
    # take minutes, while the same code runs there under the tiny-model unit tests. The discovered test names
    # exist only at ctest time (gtest_discover_tests sets ${name}_TESTS there), so a CTest include file run
    # after the discovery's adds the label.
    set(labels ${ARG_LABELS} real)
    set(script "${CMAKE_CURRENT_BINARY_DIR}/${name}_real_label.cmake")
    file(WRITE "${script}"
      "foreach(t IN LISTS ${name}_TESTS)\n"
      "  if(t MATCHES [==[${ARG_REAL}]==])\n"
      "    set_tests_properties(\"\${t}\" PROPERTIES LABELS \"${labels}\")\n"
      "  endif()\n"
      "endforeach()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
  endif()
endfunction()

function(stoke_fuzzer name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  if(NOT STOKE_FUZZ)
    return()
  endif()
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  add_dependencies(stoke_fuzzers ${name})
endfunction()

# A folder's library from its sources: every *.cc except *_test.cc / *_fuzz.cc / *_bench.cc, plus one test
# binary from its *_test.cc files and one fuzzer per *_fuzz.cc. Keeps folders from editing CMake for each file.
#   stoke_folder_library(NAME DEPS a b [TEST_DEPS c] [TEST_LABELS l] [REAL_TESTS regex])
function(stoke_folder_library name)
  cmake_parse_arguments(ARG "" "REAL_TESTS" "DEPS;PRIVATE_DEPS;TEST_DEPS;TEST_LABELS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  file(GLOB tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cc)
  file(GLOB fuzzers CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_fuzz.cc)
  file(GLOB benches CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_bench.cc)
  list(REMOVE_ITEM srcs ${tests} ${fuzzers} ${benches} "")
  if(srcs)
    stoke_library(${name} SRCS ${srcs} DEPS ${ARG_DEPS} PRIVATE_DEPS ${ARG_PRIVATE_DEPS})
  else()  # headers only (so far)
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()
  if(tests)
    stoke_test(${name}_test SRCS ${tests} DEPS ${name} ${ARG_TEST_DEPS} LABELS ${ARG_TEST_LABELS}
               REAL "${ARG_REAL_TESTS}")
  endif()
  foreach(f ${fuzzers})
    get_filename_component(fname ${f} NAME_WE)
    stoke_fuzzer(${fname} SRCS ${f} DEPS ${name})
  endforeach()
endfunction()
