# edgesteer: build the custom caddy and coredns, run the demo, test, bench.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/edgesteer/edgesteer/internal/version.Version=$(VERSION)
# TAGS=coredns_all builds bin/coredns with every stock CoreDNS plugin (the
# default leaves out the cloud, Kubernetes and tracing ones: README, CoreDNS).
TAGS    ?=

.PHONY: all build run test bench xcaddy vet clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/caddy ./builds/caddy
	$(GO) build -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o bin/coredns ./builds/coredns

# Builds both binaries and starts the demo on loopback; Ctrl-C stops it and
# make exits 0. In a terminal the demo runs as a job of its own (set -m), so
# Ctrl-C reaches the demo, which stops cleanly, and not make, which would
# report the interrupt as an error.
run: build
	@if [ -t 0 ]; then set -m; fi; ./scripts/demo.sh

# Installs missing test tools (as root), then vet, staticcheck and every test.
test:
	./scripts/test.sh

bench: build
	./scripts/bench.sh

# Builds bin/caddy-xcaddy with xcaddy from xcaddy.json.
xcaddy:
	$(GO) run ./builds/xcaddy -manifest xcaddy.json -output bin/caddy-xcaddy

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
