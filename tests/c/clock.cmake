# Wall-clock steps (libfaketime: an hour back, a day forward) leave the
# memory backend's decisions as they were. Debian's faketime package puts the
# library under the multiarch directory; tools/deps.sh test installs it.
hirate_add_test(test_clock test_clock.c)
target_compile_definitions(test_clock PRIVATE
  HIRATE_FAKETIME_LIB="/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/faketime/libfaketime.so.1")
