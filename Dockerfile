# mrtr-proxy: multi-stage build → distroless runtime with only the binary.
# Build:  docker build -t mrtr-proxy .
# Run:    docker run -p 8080:8080 mrtr-proxy --config /etc/mrtr-proxy/config.toml \
#           --listen 0.0.0.0:8080 --upstream http://upstream:3000/mcp
# Ports:  8080 the MCP endpoint (and /healthz, /readyz, /metrics unless [admin] listen moves them,
#         e.g. to 9090 as deploy/kubernetes/ does). Runs as the distroless nonroot user (65532).
FROM rust:1.95-bookworm AS chef
RUN cargo install cargo-chef --locked
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --recipe-path recipe.json
COPY . .
RUN cargo build --release --locked --bin mrtr-proxy \
 && ./target/release/mrtr-proxy --version \
 && ./target/release/mrtr-proxy check-config config/mrtr-proxy.toml

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /src/target/release/mrtr-proxy /usr/local/bin/mrtr-proxy
COPY --from=builder /src/config/mrtr-proxy.toml /etc/mrtr-proxy/config.toml
EXPOSE 8080
# Probes: GET /healthz (liveness), GET /readyz (upstream answered initialize; 503 while draining).
# Distroless has no curl: the binary probes itself, at the address its config gives.
HEALTHCHECK --interval=10s --timeout=5s --retries=3 \
  CMD ["/usr/local/bin/mrtr-proxy", "healthcheck", "--config", "/etc/mrtr-proxy/config.toml", "--listen", "0.0.0.0:8080"]
# Arguments are CMD, not ENTRYPOINT, so that `docker run … ARGS` and Kubernetes `args` replace them.
ENTRYPOINT ["/usr/local/bin/mrtr-proxy"]
CMD ["--config", "/etc/mrtr-proxy/config.toml", "--listen", "0.0.0.0:8080"]
