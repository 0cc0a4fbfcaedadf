# syntax=docker/dockerfile:1
# Builds static floodgate-manager and floodgate-sidecar binaries and ships
# each in a minimal, non-root final stage: pick the image with
# --target floodgate-manager or --target floodgate-sidecar. The chart runs
# each image's own entrypoint.
#
# Without Docker, `make images` (hack/images) builds the same images: the
# same files, user, entrypoint and labels, on an empty base with distroless
# static's /etc/passwd, /tmp and CA certificates. Tag them as the chart
# expects: ghcr.io/floodgate-dev/<target>:<the chart's appVersion>.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY sidecar/ sidecar/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/floodgate-manager ./cmd/floodgate-sidecar

FROM gcr.io/distroless/static-debian12:nonroot AS floodgate-sidecar
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="floodgate-sidecar" \
      org.opencontainers.image.description="floodgate's rate-limiting proxy, injected next to each opted-in pod's application" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/floodgate-dev/floodgate" \
      org.opencontainers.image.url="https://github.com/floodgate-dev/floodgate" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="floodgate"
COPY --from=build /out/floodgate-sidecar /floodgate-sidecar
USER 65532:65532
ENTRYPOINT ["/floodgate-sidecar"]

FROM gcr.io/distroless/static-debian12:nonroot AS floodgate-manager
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="floodgate-manager" \
      org.opencontainers.image.description="floodgate's operator: policy and CounterStore controllers, sidecar injector and policy validation webhooks" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/floodgate-dev/floodgate" \
      org.opencontainers.image.url="https://github.com/floodgate-dev/floodgate" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="floodgate"
COPY --from=build /out/floodgate-manager /floodgate-manager
COPY --from=build /out/floodgate-sidecar /floodgate-sidecar
USER 65532:65532
ENTRYPOINT ["/floodgate-manager"]
