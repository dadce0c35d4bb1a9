# The monolock server in an image that holds nothing but the binary and the
# CA certificates. Build it from the repository's root:
#
#   docker build -t ghcr.io/monolock-dev/monolock \
#     --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#
#   docker run -p 127.0.0.1:7070:7070 -p 127.0.0.1:9090:9090 ghcr.io/monolock-dev/monolock
#
# Ports: 7070 is the lock protocol (on all interfaces inside the container:
# loopback would be useless there), 9090 is /metrics, /healthz and /readyz.
# WARNING: the protocol port is plaintext with no authentication by default;
# anyone who reaches it can take any lock. The example publishes it on the
# host's loopback only. Publishing it beyond (-p 7070:7070 is every
# interface of the host) is safe only with mutual TLS and rules
# (MONOLOCK_TLS_CERT, MONOLOCK_TLS_KEY, MONOLOCK_TLS_CLIENT_CA,
# MONOLOCK_ACL_FILE, with the files mounted), or on a trusted network.
# The admin API is off; it has no authentication, so if you turn it on keep
# it on the container's loopback (MONOLOCK_ADMIN_LISTEN_ADDRESS=127.0.0.1:7071)
# and reach it with `docker exec CONTAINER /monolock locks`. The image has
# no shell and no kill: reload the TLS files and rules (SIGHUP) with
# `docker exec CONTAINER /monolock reload` (or `docker kill -s HUP CONTAINER`).
# deploy/check-image.sh runs this file's build command outside Docker and
# checks the result.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY . .
# The go command stamps the version from .git, which is not in the build
# context (.dockerignore); these arguments stand in for it.
ARG VERSION=""
ARG REVISION=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X main.stampVersion=${VERSION} -X main.stampRevision=${REVISION}" -o /out/monolock ./cmd/monolock

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/monolock /monolock
ENV MONOLOCK_LISTEN_ADDRESS=0.0.0.0:7070 \
    MONOLOCK_OPS_LISTEN_ADDRESS=0.0.0.0:9090
# 65532 is "nonroot" in distroless images; a scratch image has no passwd
# file, so the user is numeric.
USER 65532:65532
EXPOSE 7070 9090
ENTRYPOINT ["/monolock"]
