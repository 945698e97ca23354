# The manager image: static Go binaries (the manager, and the optional A2A gateway of
# config/a2a-gateway) on distroless, running as the non-root user 65532.
#   docker build -t registry.example.com/toolnexus-operator:v0.1.0 .
# Build for another platform with --platform; the builder cross-compiles (no emulation needed).
FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH

WORKDIR /workspace
# Dependencies first, so that a source change does not download the modules again.
COPY go.mod go.sum ./
RUN go mod download

COPY api/ api/
COPY cmd/manager/ cmd/manager/
COPY cmd/a2a-gateway/ cmd/a2a-gateway/
COPY internal/ internal/

# CGO off: a static binary that needs no libc in the runtime image.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o manager ./cmd/manager && \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o a2a-gateway ./cmd/a2a-gateway

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/manager /manager
COPY --from=builder /workspace/a2a-gateway /a2a-gateway
USER 65532:65532

ENTRYPOINT ["/manager"]
