# Multi-stage build of a static dynwatch binary on a distroless, non-root base.
#   docker build -t dynwatch/dynwatch:0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY main.go ./
COPY config/ config/
COPY dynamicinformer/ dynamicinformer/
COPY httpapi/ httpapi/
COPY webhook/ webhook/
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/dynwatch .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dynwatch /dynwatch
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/dynwatch"]
