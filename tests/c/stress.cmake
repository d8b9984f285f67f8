# 64 threads sharing limiters: the memory backend, the Redis backend (its own
# redis-server) and outages while the server is stopped, killed and
# restarted. `make test-tsan` runs the tests labelled tsan under
# ThreadSanitizer; the plain and ASan runs include this one too.
hirate_add_test(test_stress test_stress.c)
set_tests_properties(test_stress PROPERTIES LABELS tsan)

# The other programs that share a limiter among threads (or fork with
# threads running) are TSan-clean as well. test_policy is free of races too,
# but it times bursts against backoffs of 20 to 400 ms, which TSan's
# slowdown stretches past its bounds, so it runs in the plain and ASan
# builds only.
foreach(t test_memory test_shared test_redis test_op test_bands test_metrics)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS tsan)
  endif()
endforeach()

# Coalescing: 64 threads on a pool of 2 connections (riders on each other's
# round trips), a SCRIPT FLUSH, a stopped server and fork() meanwhile.
hirate_add_test(test_coalesce test_coalesce.c)
set_tests_properties(test_coalesce PROPERTIES LABELS tsan)

# Two threads failing at once on one limiter in two ways each read their own
# message; a batch's items each theirs (its own redis-server).
hirate_add_test(test_errmsg test_errmsg.c)
set_tests_properties(test_errmsg PROPERTIES LABELS tsan)

# 64 threads on the memory backend, disjoint and shared keys, through the
# real clock: exactly capacity x keys admitted.
hirate_add_test(test_memory_threads test_memory_threads.c)
set_tests_properties(test_memory_threads PROPERTIES LABELS tsan)
