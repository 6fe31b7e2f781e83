# idempotency: a PostgreSQL extension in C++, built with PGXS.
#
#   make demo        set up everything on a fresh Debian 12 machine and run the demonstration
#   make test        set up everything and run every test suite (what CI runs)
#   make bench       run the benchmark suite on a throw-away server
#   make && make install && make installcheck   against a server you run yourself

EXTENSION   = idempotency
EXTVERSION  = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big  = idempotency
OBJS        = src/pg_boundary.o \
              src/caller.o \
              src/module.o \
              src/gucs.o \
              src/stats.o \
              src/uuid_v7.o \
              src/fingerprint.o \
              src/key_lock.o \
              src/key_wait.o \
              src/route.o \
              src/key_layout.o \
              src/key_heap.o \
              src/key_heap_write.o \
              src/key_store.o \
              src/arguments.o \
              src/responses.o \
              src/own_claims.o \
              src/claim_result.o \
              src/result_scan.o \
              src/claim_protocol.o \
              src/sql_functions.o \
              src/batches.o \
              src/cleanup_shared.o \
              src/worker_session.o \
              src/cleanup_statements.o \
              src/cleanup_throttle.o \
              src/cleanup.o \
              src/cleanup_call.o \
              src/cleanup_launcher.o \
              src/cleanup_worker.o \
              src/citus_guard.o \
              src/pg/installation_check.o \
              src/pg/installation_check_tables.o \
              src/pg/installation_check_schema.o \
              src/schema_guard.o
# The released base script, the update scripts, and the script of the default version,
# made from them (so a fresh install runs the same statements as an upgraded one; TAP
# 041_upgrade compares the two installs).
DATA        = $(EXTENSION)--1.0.sql $(wildcard $(EXTENSION)--*--*.sql)
DATA_built  = $(EXTENSION)--$(EXTVERSION).sql
PGFILEDESC  = "idempotency - idempotency keys inside the application's transaction"

# pg_regress suites for `make installcheck` against an existing server (see CONTRIBUTING.md).
REGRESS      = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --load-extension=$(EXTENSION)
ISOLATION      = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation

# Debian's pg_config lives outside PATH until the server-dev package is installed.
PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
# Without PGXS nothing below can build or install: say so at once (else `make` would only
# find the SQL script up to date). `make demo`, `make test` and `make bench` install the
# server headers themselves first, and `make format` needs none.
ifeq ($(wildcard $(PGXS)),)
ifneq ($(filter-out demo test bench format,$(or $(MAKECMDGOALS),all)),)
$(error PostgreSQL's server headers were not found: "$(PG_CONFIG) --pgxs" names no pgxs.mk. Install them (Debian, Ubuntu: apt-get install postgresql-server-dev-15, or -16, -17, -18; Red Hat: postgresql15-devel), or pass PG_CONFIG=/path/to/pg_config of the PostgreSQL to build for)
endif
endif

# Our own code is held to -Werror; the server headers are system headers so that their
# warnings are not ours (GCC lets -isystem win over the -I that PGXS adds).
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server)
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Werror -Wno-register -fno-omit-frame-pointer
SHLIB_LINK  = -lstdc++

# Debian's server is built with LLVM, and PGXS would compile every .cpp a second time to
# bitcode with clang, without PG_CXXFLAGS. Inlining our SQL functions into JIT code gains
# nothing (they run SPI), so no bitcode is built or installed.
override with_llvm := no
# Rebuild an object when a header it includes changes (PGXS leaves this off by default).
override autodepend := yes

include $(PGXS)

# The default version's script: the base, then each update in order (CREATE EXTENSION drops
# their "\echo" guard lines).
$(EXTENSION)--1.3.sql: $(EXTENSION)--1.0.sql $(EXTENSION)--1.0--1.1.sql $(EXTENSION)--1.1--1.2.sql \
                       $(EXTENSION)--1.2--1.3.sql
	cat $^ > $@

.PHONY: demo test bench format lint
demo:
	bash demo/run.sh

# `make test PG_CONFIG=/opt/pg17/bin/pg_config` runs every suite against that installation
# (test/lib.sh); without it, against Debian's PostgreSQL 15.
TEST_ENV = $(if $(filter command line environment,$(origin PG_CONFIG)),PG_CONFIG="$(PG_CONFIG)")
test:
	$(TEST_ENV) bash test/run.sh

bench:
	bash bench/run.sh

format:
	clang-format -i src/*.cpp src/*.hpp src/pg/*.cpp src/pg/*.hpp

# Fails on any formatting difference, boundary violation (test/lint/boundary.py) or clang-tidy
# finding (.clang-format, .clang-tidy).
lint:
	clang-format --dry-run -Werror src/*.cpp src/*.hpp src/pg/*.cpp src/pg/*.hpp
	python3 test/lint/boundary.py
	clang-tidy --quiet src/*.cpp src/pg/*.cpp -- -x c++ -std=c++17 -D_GNU_SOURCE \
	  -isystem $(shell $(PG_CONFIG) --includedir-server) -isystem $(shell $(PG_CONFIG) --includedir)/internal
