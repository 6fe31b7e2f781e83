#!/bin/sh
# build-offline.sh OUTPUT [PACKAGE]: builds PACKAGE (./cmd/conformance-app by default) of this
# module into OUTPUT offline, from Debian's packages alone (see offline.sh).
set -eu
out="$1"
case "$out" in /*) ;; *) out="$(pwd -P)/$out" ;; esac
exec "$(dirname "$0")/offline.sh" go build -o "$out" "${2:-./cmd/conformance-app}"
