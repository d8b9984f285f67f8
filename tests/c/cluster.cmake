# Redis Cluster end to end (issue: Redis Cluster): test_cluster against
# clusters that tests/support/redis_cluster.py builds on loopback (driven
# through tests/support/cluster_harness.c), and test_slot, the core's key
# slot against Redis' own CLUSTER KEYSLOT.

add_library(hirate_cluster_support STATIC ../support/cluster_harness.c)
target_include_directories(hirate_cluster_support PUBLIC ../support)
target_link_libraries(hirate_cluster_support PUBLIC hirate_flags Threads::Threads)

hirate_add_test(test_cluster test_cluster.c)
target_link_libraries(test_cluster PRIVATE hirate_cluster_support Threads::Threads)

hirate_add_test(test_slot test_slot.c)
target_link_libraries(test_slot PRIVATE hirate_cluster_support)

set_tests_properties(test_slot PROPERTIES LABELS "cluster")
# Its load runs threads over one limiter while slots move and masters die:
# TSan runs it too (make test-tsan).
set_tests_properties(test_cluster PROPERTIES LABELS "cluster;tsan")

# The command-line tool against a cluster (tests/cli/test_cli_cluster.sh).
add_test(NAME test_cli_cluster
  COMMAND sh ${PROJECT_SOURCE_DIR}/tests/cli/test_cli_cluster.sh
          $<TARGET_FILE:hirate_cli> ${PROJECT_SOURCE_DIR})
set_tests_properties(test_cli_cluster PROPERTIES TIMEOUT 120 LABELS "cluster")

# Six servers on a 2-core machine: nothing else runs beside them, so that the
# tests that bound a call's time (test_stress, test_coalesce) are not slowed
# by them.
set_tests_properties(test_cluster test_slot test_cli_cluster PROPERTIES RUN_SERIAL TRUE)
