# Unit tests of the URL parser, and the Redis path against a real
# redis-server that test_redis starts itself (tests/support/redis_harness.c).
hirate_add_test(test_url test_url.c)
hirate_add_test(test_redis test_redis.c)
hirate_add_test(test_op test_op.c)
