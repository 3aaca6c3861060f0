# hookline container image, one image for every subcommand (`run deduper|dispatcher|retry-tiers|
# admin|all`, `topics apply`, `receiver`, `demo produce`, `dead`, `replay`, `admin token`).
#
# Two ways to build the same runtime image:
#   docker build -t hookline .
#       The usual one: compiles hookline in the official rust:1-bookworm image (stage `build`) and
#       copies the binary into debian:bookworm-slim (stage `runtime`, the default target).
#   cargo build --release --bin hookline && docker build --target prebuilt -t hookline:local .
#       For machines that cannot pull rust:1-bookworm (no registry): takes the binary built on
#       the host. The host must be Debian bookworm (same glibc, libssl3, libcurl4 as the image);
#       deploy/docker/base-image makes debian:bookworm-slim from Debian's packages if it cannot
#       be pulled either. This is what `make test-containers` builds and runs.
#
# Runs as the numeric user 10001 (Kubernetes `runAsNonRoot` can verify it) and needs no writable
# path, so `readOnlyRootFilesystem: true` works.
# The legacy builder (no BuildKit) builds every stage up to the target in file order: `prebuilt`
# comes before `build`, so `--target prebuilt` never needs the rust image.

FROM debian:bookworm-slim AS base
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="hookline" \
      org.opencontainers.image.description="Webhook dispatcher on Apache Kafka: dedupe, signed delivery, retry tiers, dead letters" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/example/hookline"
# ca-certificates: the system trust store the HTTP client reads besides its bundled roots (add a
# company CA with a derived image + update-ca-certificates, or mount a bundle and set
# SSL_CERT_FILE). libssl3/libcurl4/zlib1g: librdkafka's TLS, OAUTHBEARER/OIDC and compression.
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates libssl3 libcurl4 zlib1g \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/docker/hookline.toml /etc/hookline/hookline.toml
USER 10001:10001
ENV HOOKLINE_CONFIG=/etc/hookline/hookline.toml
# 9464: /metrics, /healthz, /readyz (server.listen); 8090: the admin API (`run admin`, with
# admin.listen set to 0.0.0.0:8090: its default is loopback).
EXPOSE 9464 8090
ENTRYPOINT ["hookline"]
CMD ["run", "all"]

# The binary built on the host: target/release/hookline, or with `--build-arg PROFILE=debug` the
# dev build's target/debug/hookline (what the container tests use: no release compile);
# .dockerignore lets only these two through.
FROM base AS prebuilt
ARG PROFILE=release
COPY target/${PROFILE}/hookline /usr/local/bin/hookline
RUN ["hookline", "--version"]

FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      cmake pkg-config libssl-dev libcurl4-openssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin hookline

FROM base AS runtime
COPY --from=build /src/target/release/hookline /usr/local/bin/hookline
RUN ["hookline", "--version"]
