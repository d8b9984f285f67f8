# The shared test vectors (tests/vectors/token_bucket.json): the C runner
# (memory backend and the real script in a throwaway redis-server; one bucket,
# several bands, and bands changed over existing keys on the Redis paths), and
# the file's own check (schema + reference model + byte-for-byte regeneration).

pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)

hirate_add_test(test_vectors test_vectors.c)
target_link_libraries(test_vectors PRIVATE PkgConfig::CJSON m)

add_test(NAME vectors_schema
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/vectors/generate.py --check)
set_tests_properties(vectors_schema PROPERTIES TIMEOUT 60)

# The limit strings' shared cases (tests/vectors/limit_strings.json).
hirate_add_test(test_limits test_limits.c)
target_link_libraries(test_limits PRIVATE PkgConfig::CJSON)

# Durations ("100ms", "0.25s", a number alone in seconds) and the options
# that are durations.
hirate_add_test(test_duration test_duration.c)
target_link_libraries(test_duration PRIVATE m)

# Client identity's shared cases (tests/vectors/client_ip.json) and SHA-256.
hirate_add_test(test_client test_client.c)
target_link_libraries(test_client PRIVATE PkgConfig::CJSON)
