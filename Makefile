# execmesh — see README.md. `make run` starts the single-host default,
# `make test` runs every test (installing bubblewrap when missing).

GO        ?= go
BIN       := bin/execmesh
PKGS      := ./...
TESTFLAGS ?= -race -count=1 -timeout 20m

.PHONY: all build run test test-short bench bench-go lint deps clean

all: build

deps:
	@./scripts/ensure-deps.sh
	@$(GO) mod download

build:
	$(GO) build -o $(BIN) ./cmd/execmesh

run: build
	./$(BIN) up $(ARGS)

test: deps
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) test $(TESTFLAGS) $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./session/ ./protocol/ ./approvals/

lint:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

clean:
	rm -rf bin
