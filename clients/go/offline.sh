#!/bin/sh
# Runs a go command on this module offline, from Debian's packages alone (golang-go,
# golang-github-jackc-pgx-v4-dev, golang-github-rabbitmq-amqp091-go-dev): GOPATH mode, with
# the packages in /usr/share/gocode and this module as import path idempotency/clients/go
# through a symlink in a private GOPATH. From clients/go:
#   ./offline.sh go test ./...      ./offline.sh go build -o app ./cmd/conformance-app
set -eu
here="$(cd "$(dirname "$0")" && pwd -P)"
gopath="${IDEM_GOPATH:-${TMPDIR:-/tmp}/idempotency-gopath-$(id -u)}"
mkdir -p "$gopath/src"
link="$gopath/src/idempotency"
[ "$(readlink "$link" 2>/dev/null)" = "$(dirname "$(dirname "$here")")" ] || {
  rm -f "$link"
  ln -s "$(dirname "$(dirname "$here")")" "$link"
}
rel="${PWD#"$here"}"
[ "$rel" = "$PWD" ] && rel=""
cd "$link/clients/go$rel"
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS= exec "$@"
