# ThreadSanitizer run of the coordinator replica, metrics, degraded-update and crash tests (not part of make test:
# it needs `make SANITIZE=thread` first and takes minutes). tests/tsan.supp holds the only
# suppression (libuv's invisible close, see there).
.PHONY: tsan-coord
tsan-coord:
	$(MAKE) SANITIZE=thread
	TSAN_OPTIONS="halt_on_error=0 exitcode=66 suppressions=$(CURDIR)/tests/tsan.supp" \
	TSR_BIN=$(CURDIR)/build/san-thread/bin TSR_TEST_BIN=$(CURDIR)/build/san-thread/bin \
	TSR_BUILD=$(CURDIR)/build/san-thread \
	sh -c '/usr/bin/python3 tests/integration/test_coord_metrics.py && /usr/bin/python3 tests/integration/test_coord_replicas.py && /usr/bin/python3 tests/integration/test_coord_degraded.py && /usr/bin/python3 tests/integration/test_coord_crash.py'
