# The blocking client's sockets and TLS (core/src/transport.c, tls.c) against
# redis-servers that the test starts itself, one of them with a TLS port
# (certificates from tests/support/make_certs.sh).
hirate_add_test(test_transport test_transport.c)
# It shares a limiter among threads over TLS: `make test-tsan` runs it too.
set_tests_properties(test_transport PROPERTIES LABELS tsan)
