# hookline container image, one image for every subcommand (`run deduper|dispatcher|retry-tiers|
# admin|all`, `topics apply`, `receiver`, `demo produce`, `dead`, `replay`, `admin token`):
#   docker build -t hookline .
# Runs as the numeric user 10001 (Kubernetes `runAsNonRoot` can verify it) and needs no writable
# path, so `readOnlyRootFilesystem: true` works.
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      cmake pkg-config libssl-dev libcurl4-openssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin hookline

FROM debian:bookworm-slim
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
COPY --from=build /src/target/release/hookline /usr/local/bin/hookline
COPY deploy/docker/hookline.toml /etc/hookline/hookline.toml
USER 10001:10001
ENV HOOKLINE_CONFIG=/etc/hookline/hookline.toml
# 9464: /metrics, /healthz, /readyz (server.listen); 8090: the admin API (`run admin`, with
# admin.listen set to 0.0.0.0:8090: its default is loopback).
EXPOSE 9464 8090
ENTRYPOINT ["hookline"]
CMD ["run", "all"]
