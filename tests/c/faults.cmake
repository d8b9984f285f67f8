# The fault matrix (the table at the top of test_faults.c): real
# redis-servers that the tests start themselves, pushed into each fault, a
# delaying TCP proxy, and a scripted RESP server for malformed replies. The
# proxy and the mock server run in threads of the test program.
#
# Labelled "faults", not "tsan": `make test-tsan` runs the programs that
# share one limiter among many threads; these are about what the server does.

add_library(hirate_fault_support STATIC ../support/proxy.c ../support/mock_server.c)
target_include_directories(hirate_fault_support PUBLIC ../support)
target_link_libraries(hirate_fault_support PUBLIC hirate_flags Threads::Threads)

hirate_add_test(test_faults test_faults.c)
target_link_libraries(test_faults PRIVATE hirate_fault_support)
hirate_add_test(test_faults_mock test_faults_mock.c)
target_link_libraries(test_faults_mock PRIVATE hirate_fault_support)
set_tests_properties(test_faults test_faults_mock PROPERTIES LABELS "faults")
