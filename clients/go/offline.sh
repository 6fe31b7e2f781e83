#!/bin/sh
# Runs a go command on this module offline, from Debian's packages alone (golang-go,
# golang-github-jackc-pgx-v4-dev, golang-github-rabbitmq-amqp091-go-dev): GOPATH mode, with
# Debian's packages in /usr/share/gocode and this module as its import path
# idempotency/clients/go through a symlink in a GOPATH of its own (one per clone, under
# $TMPDIR, or IDEM_GOPATH). Run from clients/go or a folder under it:
#   ./offline.sh go test ./...
#   ./offline.sh go build -o /tmp/conformance-app ./cmd/conformance-app
# or from an example under examples/ that imports the package (examples/go/middleware), which
# is then built where it stands (from anywhere else, it runs in clients/go):
#   cd examples/go/middleware && ../../../clients/go/offline.sh go test -v
set -eu
here="$(cd "$(dirname "$0")" && pwd -P)"
root="$(dirname "$(dirname "$here")")"
gopath="${IDEM_GOPATH:-${TMPDIR:-/tmp}/idempotency-gopath-$(id -u)-$(printf %s "$root" | cksum | cut -d' ' -f1)}"
mkdir -p "$gopath/src"
link="$gopath/src/idempotency"
if [ "$(readlink "$link" 2>/dev/null)" != "$root" ]; then
  rm -f "$link"
  ln -s "$root" "$link"
fi
cwd="$(pwd -P)"
case "$cwd/" in
"$here"/*) cd "$link/clients/go${cwd#"$here"}" ;;
"$root"/examples/*) ;;  # an example that imports the package: built where it stands
*) cd "$link/clients/go" ;;
esac
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS= exec "$@"
