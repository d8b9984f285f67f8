# Unit tests of the core, one program per layer, no Redis needed: the error
# list, the sans-IO protocol, the bucket arithmetic, the memory backend (a
# process' own, and the table shared by forked processes) and the public
# API's validation, the cluster's topology rules, and the rules of a
# Sentinel service and of Redis Functions.
hirate_add_test(test_errors test_errors.c)
hirate_add_test(test_proto test_proto.c)
hirate_add_test(test_bucket test_bucket.c)
hirate_add_test(test_memory test_memory.c)
hirate_add_test(test_shared test_shared.c)
hirate_add_test(test_limiter test_limiter.c)
hirate_add_test(test_response test_response.c)
hirate_add_test(test_topology test_topology.c)
hirate_add_test(test_discovery test_discovery.c)
