# tessera-coordinator extras (owner: coordinator).
#  - libtsr_coord.a: the coordinator minus main.c, so its modules (plan builder, id
#    directory, oplog, update phases) get C unit tests. The binary links the same objects.
#  - tests/unit/test_coord_*.c link it (and see coordinator/coord.h: -Icoordinator).
#  - clockstep.so: the LD_PRELOAD shim that steps the wall clock a process sees
#    (tests/shim/clockstep.c; tests/integration/test_coord_clock.py).
COORD_LIB := $(BUILD)/libtsr_coord.a
COORD_LIB_OBJ := $(filter-out %/coordinator/main.o,$(call obj,$(COORD_SRC)))
CLOCKSTEP := $(BUILD)/tests/clockstep.so

all: $(COORD_LIB) $(CLOCKSTEP)

$(COORD_LIB): $(COORD_LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/tests/unit/test_coord_%.o: CFLAGS += -Icoordinator
# the front ends (coordinator/frontend/) include the coordinator's headers as their own
$(BUILD)/obj/coordinator/frontend/%.o: CFLAGS += -Icoordinator
$(BUILD)/tests/test_coord_%: $(BUILD)/obj/tests/unit/test_coord_%.o $(COORD_LIB) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

# Not sanitized: it is preloaded into any build (the test tells ASan not to insist on
# coming first).
$(CLOCKSTEP): tests/shim/clockstep.c
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	@$(CC) -std=c11 -O2 -g -Wall -Wextra $(WERROR) -fPIC -shared -o $@ $< -ldl

# make bench-ha: start-up of a coordinator with --etcd and an empty / cached --data beside
# the local backend (bench/bench_ha_start.py; BENCH_HA_N, BENCH_HA_DIMS).
.PHONY: bench-ha
bench-ha: all
	@TSR_BIN=$(abspath $(BIN)) /usr/bin/python3 bench/bench_ha_start.py

# make bench-ha-elect: leader key deleted -> new leader, election watched vs polled
# (TSR_LEADER_WATCH=0), modes alternating in one run (bench/bench_ha_elect.py;
# BENCH_ELECT_ROUNDS, BENCH_ELECT_TTL, BENCH_ELECT_ETCD).
.PHONY: bench-ha-elect
bench-ha-elect: all testing-build
	@TSR_BIN=$(abspath $(BIN)) /usr/bin/python3 bench/bench_ha_elect.py

# make bench-reshard: AddShardGroup / RemoveShardGroup beside a complete reload, time and
# bytes moved per million vectors (bench/bench_reshard.py; BENCH_RESHARD_N, _DIMS).
.PHONY: bench-reshard
bench-reshard: all
	@TSR_BIN=$(abspath $(BIN)) /usr/bin/python3 bench/bench_reshard.py

# make test-reshard-large: issue 19's shape at a larger size, not part of `make test`:
# 4 groups grow to 6 and shrink to 3 while 4 threads query and upserts stream
# (tests/integration/test_reshard.py; ~200k x 64 takes several minutes here; at 1M:
# TSR_RESHARD_N=1000000 TSR_RESHARD_FRACTION=0.05 make test-reshard-large).
.PHONY: test-reshard-large
test-reshard-large: all
	@TSR_RESHARD_N=$${TSR_RESHARD_N:-200000} TSR_RESHARD_DIMS=64 TSR_RESHARD_NLIST=256 \
	 TSR_RESHARD_GROUPS=4,6,3 TSR_RESHARD_CLIENTS=4 /usr/bin/python3 tests/integration/test_reshard.py
