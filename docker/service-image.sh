#!/usr/bin/env bash
# Builds the service image (docker/service.Dockerfile) locally, no registry: docker/service-image.sh [TAG]
# (default doppel-service:dev). Needs Go, the docker CLI and a CA bundle (CA_BUNDLE, default Debian's).
# The fault suite (cmd/doppel/faults_test.go) builds its image with this script too.
set -Eeuo pipefail
TAG=${1:-doppel-service:dev}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
cd "$(dirname "$0")/.."
[[ -r $CA_BUNDLE ]] || {
	echo "service-image: no CA bundle at $CA_BUNDLE (install Debian's ca-certificates, or set CA_BUNDLE)" >&2
	exit 1
}
CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
mkdir -p "$CTX/data" "$CTX/tmp"
chmod 1777 "$CTX/tmp"
cp "$CA_BUNDLE" "$CTX/ca-certificates.crt"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$CTX/doppel" ./cmd/doppel
docker build -q -f docker/service.Dockerfile -t "$TAG" "$CTX"
