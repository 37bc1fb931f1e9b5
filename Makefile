# dynwatch: the two commands a new machine needs are `make demo` and `make test`.
# Everything else they use is built from the Go module proxy by the targets below.

GO ?= go
TEST_TIMEOUT ?= 30m

.PHONY: all build demo test testbed testbed-up bench bench-api bench-webhook vet fmt-check clean

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

## test: vet, format check, and every test with the race detector against the real apiserver
test: testbed vet fmt-check
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## bench: dynwatch side by side with a bare informer and the apiserver (about 3 minutes)
bench: testbed
	$(GO) run ./test/bench -json bench.json

## bench-api: query API benchmarks over a 100k-object cache (loads the test bed: ~3 minutes)
bench-api: testbed
	$(GO) test -run '^$$' -bench . -benchtime 3000x ./httpapi/

## bench-webhook: webhook delivery throughput and latency to a loopback receiver
bench-webhook:
	$(GO) test -run '^$$' -bench Delivery -benchtime 10000x ./webhook/

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin
