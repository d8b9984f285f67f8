# Unit tests of the URL parser, and the Redis path against a real
# redis-server that test_redis starts itself (tests/support/redis_harness.c).
hirate_add_test(test_url test_url.c)
hirate_add_test(test_redis test_redis.c)
hirate_add_test(test_op test_op.c)
# Several limits on one key: the API, both backends side by side, the key's
# format, bands changed on existing keys, the deny cache and the policies per
# band, and 100 threads (its own redis-server).
hirate_add_test(test_bands test_bands.c)
# Metrics after a scripted sequence, the log of an outage, and a reset seen
# by another limiter within deny_cache_max_ms (its own redis-server).
hirate_add_test(test_metrics test_metrics.c)
