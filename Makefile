# jobreaper: build, test and lint.
#
#   make test       bash .ci/test: start PostgreSQL and Redis if needed, then go test -race ./...
#   make build      static binary in bin/jobreaper
#   make services   only make sure PostgreSQL and Redis are up
#   make lint       go vet, gofmt and golangci-lint (when installed)
#   make bench      bash .ci/bench: the scale benchmarks on the local PostgreSQL and Redis, one table
#   make reliability  bash .ci/reliability: the race, faults, soak, blip, fleet and bad-input suites under
#                   -race, one table of their figures (JOBREAPER_RACE_RUNS, JOBREAPER_FAULT_KILLS,
#                   JOBREAPER_SOAK_DURATION and JOBREAPER_FLEET_DURATION scale them; ARGS="..." passes
#                   flags to go test)

GO ?= go
# Stamped into the binary by the linker, so that `jobreaper version` names
# the release and commit even where Go's VCS stamping is off (a Docker
# build context has no .git). Override on the command line when building
# from a tarball: make build VERSION=v1.2.3 REVISION=<commit>.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.buildVersion=$(VERSION) -X main.buildRevision=$(REVISION)
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: test services build lint docker bench reliability

test:
	bash .ci/test

services:
	bash .ci/services.sh

bench:
	bash .ci/bench

reliability:
	@bash .ci/reliability $(ARGS)

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/jobreaper ./cmd/jobreaper

lint:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run; \
	else echo "golangci-lint not installed: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@latest"; fi

docker:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t jobreaper .
