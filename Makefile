# tollgate — developer and CI entry points.
#
#   make build   binaries into bin/
#   make test    go vet + go test ./... against private MariaDB/Redis (FUZZ=1: fuzz smoke too)
#   make run     local demo: services in .run/, fakellm, gateway on 127.0.0.1:8080
#   make down    stop the services of `make run`
#   make fuzz    60s of FuzzScanner in ./metering/
#   make lint    gofmt + go vet
#   make bench   scripts/bench.sh
#   make bench-ab BASE=<rev>   scripts/bench-ab.sh: BASE against the working tree, pair by pair

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

# Go lives in /usr/local/go on the CI/dev boxes; keep whatever else is on PATH.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go

# gateway and fakellm always; plainproxy/loadgen only once their dirs exist.
CMDS := gateway fakellm $(notdir $(wildcard cmd/plainproxy cmd/loadgen))

.PHONY: all build test run down bench bench-ab fuzz lint clean

all: build

build:
	@mkdir -p bin
	@set -e; for c in $(CMDS); do \
		echo "$(GO) build -o bin/$$c ./cmd/$$c"; \
		$(GO) build -o bin/$$c ./cmd/$$c; \
	done

test:
	@bash scripts/test.sh

run:
	@bash scripts/run.sh

down:
	@bash scripts/services.sh down .run

bench:
	@if [ -f scripts/bench.sh ]; then \
		bash scripts/bench.sh; \
	else \
		echo "make bench: scripts/bench.sh does not exist yet" >&2; exit 1; \
	fi

bench-ab:
	@bash scripts/bench-ab.sh

fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzScanner -fuzztime=60s ./metering/

lint:
	@files="$$(find . -name '*.go' -not -path './.git/*' -not -path './.run/*' -not -path '*/testdata/*')"; \
	unformatted="$$(if [ -n "$$files" ]; then gofmt -l $$files; fi)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt needed on:" >&2; echo "$$unformatted" >&2; exit 1; \
	fi
	$(GO) vet ./...

clean:
	rm -rf bin
