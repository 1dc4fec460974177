# greendot's container image: a static binary on distroless, run as non-root.
#
#   docker build --build-arg VERSION=1.2.3 -t greendot:1.2.3 .
#   podman build --format docker --build-arg VERSION=1.2.3 -t greendot:1.2.3 .
#
# podman and buildah need --format docker to keep the HEALTHCHECK: the OCI
# image format has no field for it. docs/deploy.md covers compose and Helm.

# go.mod asks for Go 1.26.8 or later; the 1.26 tag follows the newest 1.26.x.
ARG GO_VERSION=1.26

# Registries are named in full so that podman, which has no default
# registry, resolves them as docker does.
# The build runs on the builder's own platform and cross-compiles, so a
# multi-platform build (--platform linux/amd64,linux/arm64) needs no emulation.
FROM --platform=$BUILDPLATFORM docker.io/library/golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change. The
# patched nbio (third_party/nbio, a replace in go.mod) is read here too.
COPY go.mod go.sum ./
COPY third_party ./third_party
RUN go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
# Static (no cgo) so it runs on an image with no libc; -trimpath and -s -w
# keep build paths and debug tables out of the binary.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/greendot ./cmd/greendot

# distroless static: CA certificates, /etc/passwd with nonroot (65532), tzdata,
# no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="greendot" \
      org.opencontainers.image.description="presence server: who is online, over WebSocket and HTTP" \
      org.opencontainers.image.source="https://github.com/greendot/greendot" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/greendot /greendot
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 65532:65532
# ":8080" is every address (IPv4 and IPv6), not loopback: reachable from
# outside the container. Set as the environment, not as a flag in CMD, so that
# GREENDOT_ADDR given at run time still wins (a flag would override it).
ENV GREENDOT_ADDR=:8080
EXPOSE 8080
# Probes /readyz on the default address: healthy = ready to take clients
# (503 while Redis is unreachable or while the node drains).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/greendot", "healthcheck"]
ENTRYPOINT ["/greendot"]
CMD ["serve"]
