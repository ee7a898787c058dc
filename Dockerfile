# syntax=docker/dockerfile:1
#
# The `outbox` binary in a small image that runs as a non-root user:
#   docker build -t outbox:0.1.0 .
#   docker run --rm -e OUTBOX_DATABASE_URL -e OUTBOX_SINK -p 9464:9464 \
#     outbox:0.1.0 relay --metrics-addr 0.0.0.0:9464
# Pass the URLs as environment variables (never as arguments: they hold passwords). See
# docs/deploy.md. Linted with hadolint in CI (scripts/check-deploy.sh).

# Build: the command CI builds the release binary with. Everything native is compiled from
# source by the crates themselves (librdkafka by its own configure script, SQLite, ring): make
# and a C compiler are all it needs, no cmake and no -dev package. The image's gcc is enough;
# make is added.
FROM rust:1.94-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends make=4.3-4.1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cargo registry and the target directory are cache mounts: rebuilds after a source change
# recompile the workspace only. The binary is copied out of the cache before the step ends.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p outbox-cli \
 && install -m 0755 target/release/outbox /usr/local/bin/outbox

# Run: glibc and libgcc (all the binary links beside the kernel) and CA certificates, no shell
# and no package manager; user 65532 ("nonroot"). The root filesystem can be mounted read-only:
# the relay writes nothing but its sinks' files (the file: sink), which want a volume.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/outbox /usr/local/bin/outbox
USER 65532:65532
WORKDIR /home/nonroot
# /metrics, /livez and /readyz of `outbox relay` and `outbox inbox`, on the container's
# address (reachable through a published port); --metrics-addr overrides.
ENV OUTBOX_METRICS_ADDR=0.0.0.0:9464 \
    OUTBOX_INBOX_METRICS_ADDR=0.0.0.0:9464
EXPOSE 9464
ENTRYPOINT ["outbox"]
CMD ["--help"]
