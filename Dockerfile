# syntax=docker/dockerfile:1
# Builds static floodgate-manager and floodgate-sidecar binaries and ships
# each in a minimal, non-root final stage: pick the image with
# --target floodgate-manager or --target floodgate-sidecar. The chart runs
# each image's own entrypoint.

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
COPY --from=build /out/floodgate-sidecar /floodgate-sidecar
USER 65532:65532
ENTRYPOINT ["/floodgate-sidecar"]

FROM gcr.io/distroless/static-debian12:nonroot AS floodgate-manager
COPY --from=build /out/floodgate-manager /floodgate-manager
COPY --from=build /out/floodgate-sidecar /floodgate-sidecar
USER 65532:65532
ENTRYPOINT ["/floodgate-manager"]
