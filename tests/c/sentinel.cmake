# Redis Sentinel end to end (issue: Sentinel, READONLY, Redis Functions):
# test_sentinel against groups that tests/support/redis_sentinel.py builds on
# loopback (driven through tests/support/sentinel_harness.c), a master
# demoted behind a plain URL (a proxy in front of two redis-servers), and
# Redis Functions on a plain Redis 7.

if(NOT TARGET PkgConfig::CJSON)
  pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
endif()

add_library(hirate_sentinel_support STATIC ../support/sentinel_harness.c)
target_include_directories(hirate_sentinel_support PUBLIC ../support)
target_link_libraries(hirate_sentinel_support
  PUBLIC hirate_flags PkgConfig::HIREDIS PkgConfig::CJSON Threads::Threads)

hirate_add_test(test_sentinel test_sentinel.c ../support/proxy.c)
target_link_libraries(test_sentinel PRIVATE hirate_sentinel_support Threads::Threads)

# Its load runs threads over one limiter while the master moves: TSan runs
# it too (make test-tsan). Three groups of five servers and a failover each:
# it runs alone, as the cluster tests do, so that the 2 s bound is the
# limiter's and not the machine's.
set_tests_properties(test_sentinel PROPERTIES LABELS "sentinel;tsan" RUN_SERIAL TRUE)

# The health check against a live, stopped, misconfigured and replica Redis,
# a cluster and a Sentinel service.
hirate_add_test(test_check test_check.c)
target_link_libraries(test_check PRIVATE hirate_cluster_support hirate_sentinel_support
  Threads::Threads)
set_tests_properties(test_check PROPERTIES LABELS "cluster" RUN_SERIAL TRUE)
