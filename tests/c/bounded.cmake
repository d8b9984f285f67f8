# Bounded memory: 10^6 keys against a cap of 10^4 in the memory backend and
# in the deny cache; counts, RSS, and a drained bucket that eviction spares.
hirate_add_test(test_bounded test_bounded.c)
