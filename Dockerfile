# syntax=docker/dockerfile:1
# Multi-stage build: gateway + fakellm, static binaries on distroless.
#   docker build -t tollgate:local .
#   docker run --rm tollgate:local --help          (gateway)
#   docker run --rm --entrypoint /usr/local/bin/fakellm tollgate:local -listen 0.0.0.0:9090

FROM golang:1.26-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
# go.mod pins a patch release; let the go command fetch it if the image is older.
ENV GOTOOLCHAIN=auto

COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /out/bin /out/app \
 && go build -ldflags='-s -w' -o /out/bin/gateway ./cmd/gateway \
 && go build -ldflags='-s -w' -o /out/bin/fakellm ./cmd/fakellm \
 && if [ -f config.example.yaml ]; then cp config.example.yaml /out/app/; fi

FROM gcr.io/distroless/static-debian12:nonroot
WORKDIR /app
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/app/ /app/
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["serve", "--config", "/app/config.example.yaml"]
