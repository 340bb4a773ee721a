# jobreaper: build, test and lint.
#
#   make test       bash .ci/test: start PostgreSQL and Redis if needed, then go test -race ./...
#   make build      static binary in bin/jobreaper
#   make services   only make sure PostgreSQL and Redis are up
#   make lint       go vet, gofmt and golangci-lint (when installed)

GO ?= go
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: test services build lint docker

test:
	bash .ci/test

services:
	bash .ci/services.sh

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/jobreaper ./cmd/jobreaper

lint:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run; \
	else echo "golangci-lint not installed: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@latest"; fi

docker:
	docker build -f deploy/Dockerfile -t jobreaper .
