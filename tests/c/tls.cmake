# TLS and misconfigurations end to end (issue: TLS in every language):
# test_tls against TLS redis-servers whose certificates the harness makes
# (tests/support/make_certs.sh), the shared vectors over TLS (test_vectors
# with HIRATE_TEST_TLS=1), and the fault matrix's spot checks over TLS.

hirate_add_test(test_tls test_tls.c)
target_link_libraries(test_tls PRIVATE hirate_fault_support)

add_test(NAME test_vectors_tls COMMAND test_vectors)
set_tests_properties(test_vectors_tls PROPERTIES TIMEOUT 180
  ENVIRONMENT "HIRATE_SOURCE_DIR=${PROJECT_SOURCE_DIR};HIRATE_TEST_TLS=1")

hirate_add_test(test_faults_tls test_faults_tls.c)
target_link_libraries(test_faults_tls PRIVATE hirate_fault_support OpenSSL::SSL)
set_tests_properties(test_tls test_vectors_tls test_faults_tls PROPERTIES LABELS "tls")
