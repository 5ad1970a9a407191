#!/usr/bin/env bash
# Build everything the side-by-side benchmarks need. Idempotent.
#   bench/build.sh            # install missing tools, build peers and canter
#   SKIP_APT=1 bench/build.sh # do not try apt-get
# Installs (if missing): wrk nginx-light h2o nghttp2-client gcc liburing-dev postgresql (apt-get), Go (needed for
# the Go peers; not installed here if absent: those peers are then reported and skipped).
# Builds: bench/build/ceiling, bench/build/ceiling-uring, bench/build/go-nethttp, bench/build/fasthttp,
#         bench/build/go-ws, bench/build/quic-go-load (an HTTP/3 load client on quic-go), bench/peers/node-ws/node_modules (ws, bun), peer-ws-{axum,fast},
#         bench/target/release/peer-{hyper,actix,actix-pg,xitca-pg,may-minihttp,may-pg,kafka-rdkafka,h3-quinn,
#         quinn-canter-h3},
#         bench/build/caddy (Go module proxy), bench/build/py-aioquic (PyPI),
#         pg-clients, bench/peers/kafka-streams/target (Kafka Streams), Kafka's jars (tools/kafka),
#         target/release/canter.
# peer-may-pg needs may_postgres, which is not on crates.io: cargo fetches it from GitHub at the
# commit bench/peers/may-pg/Cargo.toml pins. Without GitHub, MAY_POSTGRES_GIT=/path/to/a/clone
# makes git fetch it from that clone instead.
# A peer that fails to build is reported at the end (and skipped by run.py, which says so).
set -u
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$BENCH")"
BUILD="$BENCH/build"
mkdir -p "$BUILD" "$BUILD/logs"
export PATH="$PATH:/usr/local/go/bin:$HOME/.cargo/bin:/usr/sbin:/sbin"

declare -a OK FAIL
ok()   { OK+=("$1"); echo "== built: $1"; }
fail() { FAIL+=("$1: $2"); echo "== FAILED: $1 ($2)"; }

# --- system packages -------------------------------------------------------------------
need=()
command -v wrk    >/dev/null || need+=(wrk)
command -v nginx  >/dev/null || need+=(nginx-light)
command -v h2o    >/dev/null || need+=(h2o)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v gcc    >/dev/null || need+=(gcc)
command -v taskset >/dev/null || need+=(util-linux)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -e /usr/include/liburing.h ] || need+=(liburing-dev)
# librdkafka (built by peer-kafka-rdkafka) includes curl's headers; its build runs cmake.
[ -e /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -e /usr/include/curl/curl.h ] || need+=(libcurl4-openssl-dev)
command -v cmake  >/dev/null || need+=(cmake)
command -v mvn    >/dev/null || need+=(maven)
if [ ${#need[@]} -gt 0 ] && [ -z "${SKIP_APT:-}" ]; then
  echo "== apt-get install ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y --no-install-recommends "${need[@]}" >"$BUILD/logs/apt.log" 2>&1; then
    $SUDO apt-get update >>"$BUILD/logs/apt.log" 2>&1
    # one at a time, so that one missing package (e.g. h2o) does not block the others
    for p in "${need[@]}"; do
      $SUDO apt-get install -y --no-install-recommends "$p" >>"$BUILD/logs/apt.log" 2>&1 \
        || echo "== apt: could not install $p (see bench/build/logs/apt.log)"
    done
  fi
  # the Debian packages start system services; the benchmarks start their own instances
  for svc in nginx h2o; do
    command -v systemctl >/dev/null && $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
fi
for t in wrk nginx h2o h2load; do
  command -v "$t" >/dev/null && ok "$t ($(command -v "$t"))" || fail "$t" "not installed"
done

# --- ceiling (C) -----------------------------------------------------------------------
if gcc -O2 -Wall -o "$BUILD/ceiling.tmp" "$BENCH/peers/ceiling/ceiling.c" 2>"$BUILD/logs/ceiling.log"; then
  mv "$BUILD/ceiling.tmp" "$BUILD/ceiling"; ok "ceiling -> bench/build/ceiling"
else
  fail ceiling "gcc: $(tail -3 "$BUILD/logs/ceiling.log" | tr '\n' ' ')"
fi
if gcc -O2 -Wall -o "$BUILD/ceiling-uring.tmp" "$BENCH/peers/ceiling/ceiling_uring.c" -luring \
    2>"$BUILD/logs/ceiling-uring.log"; then
  mv "$BUILD/ceiling-uring.tmp" "$BUILD/ceiling-uring"; ok "ceiling-uring -> bench/build/ceiling-uring"
else
  fail ceiling-uring "gcc: $(tail -3 "$BUILD/logs/ceiling-uring.log" | tr '\n' ' ')"
fi

# --- Go peers --------------------------------------------------------------------------
if command -v go >/dev/null; then
  for p in go-nethttp fasthttp go-ws quic-go-load; do
    if (cd "$BENCH/peers/$p" && go mod download && go build -trimpath -o "$BUILD/$p" .) \
         >"$BUILD/logs/$p.log" 2>&1; then
      ok "$p -> bench/build/$p"
    else
      fail "$p" "go build: $(tail -3 "$BUILD/logs/$p.log" | tr '\n' ' ')"
    fi
  done
  # Caddy (HTTP/3 with quic-go), from the Go module proxy at a pinned version (bench/h3.py).
  if GOBIN="$BUILD" go install github.com/caddyserver/caddy/v2/cmd/caddy@v2.11.9 \
       >"$BUILD/logs/caddy.log" 2>&1; then
    ok "caddy -> bench/build/caddy"
  else
    fail caddy "go install: $(tail -3 "$BUILD/logs/caddy.log" | tr '\n' ' ')"
  fi
else
  fail go-nethttp "go not found (install Go from https://go.dev/dl/)"
  fail fasthttp "go not found"
fi

# --- aioquic (bench/h3.py's idle HTTP/3 connections), from PyPI ----------------------------
if python3 -m pip install --quiet --disable-pip-version-check --target "$BUILD/py-aioquic" \
     aioquic==1.7.2 >"$BUILD/logs/aioquic.log" 2>&1; then
  ok "aioquic -> bench/build/py-aioquic"
else
  fail aioquic "pip: $(tail -3 "$BUILD/logs/aioquic.log" | tr '\n' ' ')"
fi

# --- Node.js peers: Node's ws and Bun (both from the npm registry) -----------------------
if command -v npm >/dev/null; then
  if (cd "$BENCH/peers/node-ws" && npm install --no-audit --no-fund) \
       >"$BUILD/logs/node-ws.log" 2>&1 \
     && [ -x "$BENCH/peers/node-ws/node_modules/bun/bin/bun.exe" ]; then
    ok "node-ws, bun -> bench/peers/node-ws/node_modules"
  else
    fail node-ws "npm install: $(tail -3 "$BUILD/logs/node-ws.log" | tr '\n' ' ')"
  fi
else
  fail node-ws "npm not found"
fi

# --- Kafka: the broker's jars, Market Spread on Kafka Streams (Maven Central) ------------
if "$ROOT/tools/kafka/kafka.sh" fetch >"$BUILD/logs/kafka-jars.log" 2>&1; then
  ok "kafka jars -> $(tail -1 "$BUILD/logs/kafka-jars.log")"
else
  fail kafka-jars "$(tail -2 "$BUILD/logs/kafka-jars.log" | tr '\n' ' ')"
fi
if (cd "$BENCH/peers/kafka-streams" && mvn -q -B package -DskipTests) \
     >"$BUILD/logs/kafka-streams.log" 2>&1; then
  ok "kafka-streams -> bench/peers/kafka-streams/target"
else
  fail kafka-streams "mvn: $(grep -m1 ERROR "$BUILD/logs/kafka-streams.log")"
fi

# --- Rust peers (own workspace, own target dir) ----------------------------------------
if command -v cargo >/dev/null; then
  for p in peer-hyper peer-actix peer-may-minihttp peer-actix-pg peer-xitca-pg pg-clients \
           peer-ws-axum peer-ws-fast peer-kafka-rdkafka peer-h3-quinn peer-quinn-canter-h3; do
    if cargo build --release --manifest-path "$BENCH/peers/rust/Cargo.toml" \
         --target-dir "$BENCH/target" -p "$p" >"$BUILD/logs/rust-$p.log" 2>&1; then
      ok "$p -> bench/target/release/$p"
    else
      fail "$p" "cargo: $(grep -m1 -A3 '^error' "$BUILD/logs/rust-$p.log" | tr '\n' ' ')"
    fi
  done
  # may-minihttp with may_postgres: a workspace of its own (a git dependency)
  may_env=()
  if [ -n "${MAY_POSTGRES_GIT:-}" ]; then
    may_env=(CARGO_NET_GIT_FETCH_WITH_CLI=true GIT_CONFIG_COUNT=1
             "GIT_CONFIG_KEY_0=url.file://$(cd "$MAY_POSTGRES_GIT" && pwd).insteadOf"
             "GIT_CONFIG_VALUE_0=https://github.com/Xudong-Huang/may_postgres")
  fi
  if env "${may_env[@]}" cargo build --release --manifest-path "$BENCH/peers/may-pg/Cargo.toml" \
       --target-dir "$BENCH/target" >"$BUILD/logs/rust-peer-may-pg.log" 2>&1; then
    ok "peer-may-pg -> bench/target/release/peer-may-pg"
  else
    fail peer-may-pg "cargo: $(grep -m1 -A3 '^error' "$BUILD/logs/rust-peer-may-pg.log" | tr '\n' ' ')"
  fi
  # --- canter itself ---------------------------------------------------------------------
  if (cd "$ROOT" && cargo build --release -p canter-cli \
        && cargo build --release -p canter-kafka --example bare) >"$BUILD/logs/canter.log" 2>&1; then
    ok "canter -> target/release/canter (and canter-kafka's bare client, target/release/examples/bare)"
    if "$ROOT/target/release/canter" serve --help >/dev/null 2>&1; then ok "canter serve"; \
      else fail "canter serve" "\`canter serve --help\` fails: run.py will skip canter"; fi
    if "$ROOT/target/release/canter" load --help >/dev/null 2>&1; then ok "canter load"; \
      else fail "canter load" "\`canter load --help\` fails: run.py will use wrk"; fi
  else
    fail canter "cargo: $(grep -m1 -A3 '^error' "$BUILD/logs/canter.log" | tr '\n' ' ')"
  fi
else
  fail rust "cargo not found (install from https://rustup.rs)"
fi

echo
echo "== build summary (logs in bench/build/logs/)"
for x in "${OK[@]}"; do echo "   ok      $x"; done
for x in "${FAIL[@]+"${FAIL[@]}"}"; do echo "   FAILED  $x"; done
exit 0
