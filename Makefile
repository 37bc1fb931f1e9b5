# dynwatch: the two commands a new machine needs are `make demo` and `make test`.
# Everything else they use is built from the Go module proxy by the targets below.

GO ?= go
TEST_TIMEOUT ?= 45m
# The repository's modules: the service, and the test-only modules whose dependencies (a
# Dockerfile parser; the logs the journal's was measured against) the service must not carry.
MODULES = . test/image test/walbench
# each runs a command in every module, stopping at the first that fails
each = for m in $(MODULES); do (cd $$m && $(1)) || exit 1; done

.PHONY: all build demo test robustness test-unit test-alerts test-e2e testbed testbed-up bench bench-initial-state bench-sinks bench-metadata bench-history bench-subscriptions bench-wal bench-api bench-check bench-webhook vet fmt-check clean lint

all: build

## build: compile bin/dynwatch
build:
	$(GO) build -o bin/dynwatch .

## testbed: build kube-apiserver, etcd and kubectl for the test bed (cached outside the repo)
testbed:
	$(GO) run ./test/testbed/cmd/testbed build

## testbed-up: run a local kube-apiserver until Ctrl-C, printing its kubeconfig
testbed-up:
	$(GO) run ./test/testbed/cmd/testbed up

## demo: start a local apiserver, run dynwatch against it and show changes flowing
demo: testbed
	$(GO) run ./test/demo

## test: vet, format check, lint, and every test with the race detector against the real apiserver;
## the end-to-end package runs last and alone (its one-at-a-time tests measure latency, which
## another package's tests beside them would distort); its tests that share nothing run side by
## side, TEST_PARALLEL at a time
TEST_PARALLEL ?= 8
test: testbed vet fmt-check lint
	$(call each,$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -parallel $(TEST_PARALLEL) $$($(GO) list ./... | grep -v '/test/e2e$$'))
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -parallel $(TEST_PARALLEL) ./test/e2e/

## robustness: the robustness harness: ROBUSTNESS_RUNS seeded runs, two at a time, each one fault
## of the catalogue under seeded writes, every watch and delivery checked against the apiserver's
## history (about 10 minutes on 2 cores); DYNWATCH_ROBUSTNESS_SEEDS=a,b,... replays those seeds
ROBUSTNESS_RUNS ?= 30
robustness: testbed
	DYNWATCH_ROBUSTNESS_RUNS=$(ROBUSTNESS_RUNS) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -parallel 2 -run '^TestRobustness$$' -v ./test/e2e/

## test-unit: the unit tier: every test that needs no test bed (go test -short), with the race
## detector; it neither builds nor starts the test bed, and takes under a minute
test-unit:
	$(call each,$(GO) test -race -short -count=1 ./...)

## test-alerts: the alerting rules under promtool (each test group a subtest) and the dashboard's checks
test-alerts: testbed
	$(GO) test -count=1 -run 'TestAlert|TestTheDashboard' -v ./test/chart/

## test-e2e: the end-to-end tests alone: the real binary against the test bed
test-e2e: testbed
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -parallel $(TEST_PARALLEL) ./test/e2e/

## bench: dynwatch side by side with a bare informer and the apiserver (about 3 minutes)
bench: testbed
	$(GO) run ./test/bench -json bench.json

## bench-initial-state: another sink's latency before and while a sink added by a reload with
## initialState is replayed 10,000 objects, side by side in one run (about a minute)
bench-initial-state: testbed
	$(GO) run ./test/bench -initial-state -json-only -json bench-initial-state.json

## bench-sinks: each kind of sink's throughput and dynwatch's CPU per event, a sink added by a reload
## with initialState replaying 20,000 objects: webhook, JetStream (3 replicas), Kafka (kfake),
## one dynwatch after the other (about 2 minutes)
bench-sinks: testbed
	$(GO) run ./test/bench -sinks -json-only -json bench-sinks.json

## bench-metadata: dynwatch's memory with cache: metadata against cache: full, the chart's default
## config over 5,000 configmaps, one process after the other (about 3 minutes)
bench-metadata: testbed
	$(GO) run ./test/bench -metadata-only -json bench-metadata.json

## bench-history: what resources[].history costs (CPU per update, memory) and its reads cost
## (a past list, revisions), history on and off side by side through one storm (about 5 minutes)
bench-history: testbed
	$(GO) run ./test/bench -history -json-only -objects 10000 -updates 60000 -rate 600 -json bench-history.json

## bench-subscriptions: what 200 teams' Subscriptions cost three configured webhooks, with and
## without them side by side (about 6 minutes)
bench-subscriptions: testbed
	$(GO) run ./test/bench -subscriptions -json-only -json bench-subscriptions.json

## bench-wal: the logs the journal could keep its records in (journal/wal, bbolt, raft-wal,
## Pebble's WAL writer) under the journal's workload, side by side (about 10 seconds)
bench-wal:
	cd test/walbench && $(GO) test -run XXX -bench . -benchtime 300x .

## bench-api: query API benchmarks over a 100k-object cache (loads the test bed: ~3 minutes)
bench-api: testbed
	$(GO) test -run '^$$' -bench . -benchtime 3000x ./httpapi/

## bench-check: one consistency check of a 100,000-object cache: its time, what it allocates and
## the CPU it takes in dynwatch and in the apiserver, at three page sizes (loads the test bed: ~4 minutes)
bench-check: testbed
	$(GO) test -run '^$$' -bench ConsistencyCheck -benchtime 5x ./dynamicinformer/

## bench-webhook: webhook delivery throughput and latency to a loopback receiver
bench-webhook:
	$(GO) test -run '^$$' -bench Delivery -benchtime 10000x ./delivery/

## lint: golangci-lint with .golangci.yml over ./... of every module; the pinned version is built once from the
## Go module proxy into a cache outside the repo (a directory per version and Go toolchain)
GOLANGCI_LINT_VERSION ?= v2.15.0
TOOLS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dynwatch-tools
GOLANGCI_LINT_DIR = $(TOOLS_CACHE)/golangci-lint-$(GOLANGCI_LINT_VERSION)-$(shell $(GO) env GOVERSION)
lint:
	@test -x $(GOLANGCI_LINT_DIR)/golangci-lint || { echo "lint: building golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOLANGCI_LINT_DIR) (once; about 2 minutes)"; \
		GOBIN=$(GOLANGCI_LINT_DIR) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); }
	$(call each,$(GOLANGCI_LINT_DIR)/golangci-lint run ./...)

vet:
	$(call each,$(GO) vet ./...)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin
