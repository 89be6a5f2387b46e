# execmesh — see README.md. `make run` starts the single-host default,
# `make test` runs every test (installing bubblewrap when missing).

GO        ?= go
BIN       := bin/execmesh
PKGS      := ./...
TESTFLAGS ?= -race -count=1 -timeout 25m

.PHONY: all build install run test test-short bench bench-go lint deps clean man install-man

all: build

deps:
	@./scripts/ensure-deps.sh
	@$(GO) mod download

# -buildvcs=auto: `execmesh version` names the commit (and a dirty tree)
# when building from a git clone, whatever GOFLAGS says.
build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/execmesh

# `make install` copies bin/execmesh to $(PREFIX)/bin (default
# /usr/local/bin), so that `execmesh` is on PATH; DESTDIR stages it for a
# package. It builds only when bin/execmesh is missing, so that `make
# build && sudo make install` needs no Go toolchain on root's PATH.
PREFIX ?= /usr/local
install:
	@test -x $(BIN) || $(MAKE) build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/execmesh

# `make man`: one man page per command (execmesh.1, execmesh-exec.1, …)
# in bin/man, generated from the command tree. `make install-man` copies
# them to $(MANDIR) (default /usr/local/share/man/man1) and updates the
# index; then `man execmesh-exec` works.
MANDIR ?= /usr/local/share/man/man1
man: build
	rm -rf bin/man
	./$(BIN) man bin/man

install-man: man
	install -d $(MANDIR)
	install -m 644 bin/man/*.1 $(MANDIR)/
	-mandb -q 2>/dev/null

run: build
	./$(BIN) up $(ARGS)

test: deps
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) test $(TESTFLAGS) $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

# `make bench`: DESIGN.md §6's figures, each a ratio against a baseline
# measured in the same run, printed as a table and written to
# bench/results.json (see bench/README.md). Not part of `make test`.
# BENCHFLAGS passes flags: BENCHFLAGS=-quick, BENCHFLAGS="-sessions 2000".
bench: build
	$(GO) build ./...
	$(GO) build -o bin/execmesh-bench ./bench
	./bin/execmesh-bench -execmesh $(BIN) $(BENCHFLAGS)

# `make bench-openclaw` (optional, not in CI): installs openclaw@2026.9.6 and
# Node.js 26 from the npm registry into OPENCLAW_DIR (default
# ~/.cache/openclaw-oracle) and runs the same workloads on both.
.PHONY: bench-openclaw
bench-openclaw: build
	./bench/openclaw/setup.sh "$(or $(OPENCLAW_DIR),$(HOME)/.cache/openclaw-oracle)"
	$(GO) build -o bin/execmesh-bench ./bench
	./bin/execmesh-bench -execmesh $(BIN) -only openclaw -openclaw-dir "$(or $(OPENCLAW_DIR),$(HOME)/.cache/openclaw-oracle)" -out bench/results-openclaw.json $(BENCHFLAGS)

lint:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

clean:
	rm -rf bin
