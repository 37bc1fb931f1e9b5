# Multi-stage build of a static dynwatch binary on a distroless, non-root base.
#   docker build -t dynwatch/dynwatch:0.1.0 .
# The build context is everything .dockerignore does not deny; test/image replays the build
# stage from exactly that context on every `make test`.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o dynwatch .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/dynwatch /dynwatch
USER 65532:65532
# api.address and metrics.address by default.
EXPOSE 8443 9090
ENTRYPOINT ["/dynwatch"]
