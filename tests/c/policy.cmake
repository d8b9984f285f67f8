# The failure policies, the circuit breaker, the deny cache and batches,
# against a real redis-server that test_policy starts itself.
hirate_add_test(test_policy test_policy.c)
