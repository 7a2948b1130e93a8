# One ctest test per GoogleTest suite of meshsim_tests, instead of gtest_discover_tests' one
# per test. Every process loads LibTorch (about 0.65 s) and most suites share set-up between
# their tests (a Layouts suite trains its layouts once per process): run one test at a time,
# the 711 tests took about 12 minutes of a 2-core `make test`, as suites they take about half.
#
# Run by meshsim_tests' POST_BUILD step in script mode:
#   cmake -DBINARY=... -DOUT=... -DWORKDIR=... -P test_suites.cmake
# It lists the tests (--gtest_list_tests) and writes OUT, which ctest includes. A suite whose
# every test skipped exits 77 (tests/main.cpp) and is reported as skipped, not as passed; a
# suite gets 600 s per test, at most 3000 s (its tests have their own timeouts, a hang inside
# one ends it long before).

execute_process(COMMAND "${BINARY}" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE result WORKING_DIRECTORY "${WORKDIR}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "meshsim_tests --gtest_list_tests failed (${result}):\n${listing}")
endif()

string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(current "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ].*)\\.$")
    set(current "${CMAKE_MATCH_1}")
    list(APPEND suites "${current}")
    set(count_${current} 0)
  elseif(line MATCHES "^  [^ ]" AND NOT current STREQUAL "")
    math(EXPR count_${current} "${count_${current}} + 1")
  endif()
endforeach()

# Seconds the slowest suites took on the 2-core development machine (ctest -j2): ctest starts
# tests in descending COST, and a fresh build has no timings of its own yet, so without these
# the longest suites could start last and leave one core idle at the end.
set(slow_suites CliProcesses=71 CliProcessFaults=67 TrainResume=63 PipelineExecutor=50
    CliExport=46 MeshEquivalence=44 CliHardening=43 CliBadInput=42
    Zero=40 ParallelEquivalence=40 CliServe=28 Validation=27 Layouts/PlanMatchesTraining=26
    CliPrecision=24 ExpertParallel=24 LlamaEquivalence=22 ContextParallel=20 FsdpMesh=19
    ResNet50=19 CliModels=18 CliPlan=17 CliMesh=15 HfLlamaVariants=14 CheckpointIntegrity=14
    CliValidate=13 CostPredictRun=12 CliHf=12 CliReport=11)

foreach(entry IN LISTS slow_suites)
  string(REGEX REPLACE "=.*" "" name "${entry}")
  string(REGEX REPLACE ".*=" "" seconds "${entry}")
  set(cost_${name} ${seconds})
endforeach()

set(script "# Written by cmake/test_suites.cmake after each build of meshsim_tests.\n")
set(total 0)
foreach(suite IN LISTS suites)
  set(count ${count_${suite}})
  math(EXPR total "${total} + ${count}")
  set(cost 0)
  if(DEFINED cost_${suite})
    set(cost ${cost_${suite}})
  endif()
  math(EXPR timeout "600 * ${count}")
  if(timeout GREATER 3000)
    set(timeout 3000)
  endif()
  string(APPEND script
    "add_test([=[${suite}]=] \"${BINARY}\" [=[--gtest_filter=${suite}.*]=])\n"
    "set_tests_properties([=[${suite}]=] PROPERTIES WORKING_DIRECTORY \"${WORKDIR}\" "
    "TIMEOUT ${timeout} COST ${cost} SKIP_RETURN_CODE 77)\n")
endforeach()
file(WRITE "${OUT}.tmp" "${script}")
file(RENAME "${OUT}.tmp" "${OUT}")
list(LENGTH suites n)
message(STATUS "meshsim_tests: ${total} tests in ${n} suites, one ctest test per suite")
