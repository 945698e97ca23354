# The manager image: a static Go binary on distroless, running as the non-root user 65532.
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
COPY internal/ internal/

# CGO off: a static binary that needs no libc in the runtime image.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o manager ./cmd/manager

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/manager /manager
USER 65532:65532

ENTRYPOINT ["/manager"]
