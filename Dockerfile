# hookline container image: `docker build -t hookline .`
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      cmake pkg-config libssl-dev libcurl4-openssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin hookline

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates libssl3 libcurl4 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 hookline
COPY --from=build /src/target/release/hookline /usr/local/bin/hookline
COPY config/hookline.example.toml /etc/hookline/hookline.toml
USER hookline
ENV HOOKLINE_CONFIG=/etc/hookline/hookline.toml \
    HOOKLINE_SERVER__LISTEN=0.0.0.0:9464 \
    HOOKLINE_LOG__FORMAT=json
EXPOSE 9464
ENTRYPOINT ["hookline"]
CMD ["run", "all"]
