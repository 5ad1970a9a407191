#!/usr/bin/env bash
# A throwaway Apache Kafka cluster (KRaft, no ZooKeeper) on loopback, from Kafka's own jars on
# Maven Central and a Java runtime (Debian's openjdk-17-jre-headless is enough).
#
#   kafka.sh fetch                      the jars, once, into $CANTER_KAFKA_JARS
#                                       ($CANTER_KAFKA_VERSION: another release, e.g. 3.9.1)
#   kafka.sh start DIR [options]        format and start a cluster whose files live in DIR;
#                                       prints its bootstrap address when every broker serves
#       --brokers N     nodes, each broker and controller (default 1; 3 for failover tests)
#       --port P        the first broker's port (default: free ones); node i listens on P+i-1
#       --watch PID     stop the cluster when process PID exits (a test binary that dies)
#       --heap SIZE     each node's JVM heap (default 512m)
#       --secure TLSDIR listeners with security too (on every node), from the PEM files in
#                       TLSDIR: localhost.keystore.pem (key and chain for "localhost"),
#                       ip.keystore.pem (key and chain for 127.0.0.1), client-ca.pem (the CA
#                       of client certificates). DIR/listeners then names them (every
#                       node's, comma-separated):
#                         sasl_ssl=localhost:P   PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
#                         ssl=127.0.0.1:P        TLS requiring a client certificate (mTLS)
#                         sasl_plaintext=127.0.0.1:P
#                       users: alice / alice-secret (every mechanism), bob / bob-secret (SCRAM)
#       --reauth-ms MS  SASL sessions last MS (connections.max.reauth.ms; KIP-368)
#       --classic-only  the group coordinators speak the classic group protocol only
#                       (group.coordinator.rebalance.protocols=classic), as before Kafka 4.0
#   kafka.sh stop DIR                   stop every node of DIR's cluster (SIGTERM, then SIGKILL)
#   kafka.sh kill DIR NODE [SIGNAL]     signal one node (default KILL): failover tests
#   kafka.sh restart DIR NODE           start one node again (after kill), same storage
#   kafka.sh run DIR CLASS ARGS...      run one of Kafka's tools (kafka-producer-perf-test is
#                                       org.apache.kafka.tools.ProducerPerformance) on the jars
#
# Node i's files: DIR/node-i/{server.properties,data,log}; DIR/bootstrap holds the address.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# CANTER_KAFKA_VERSION picks another release than tools/kafka/pom.xml's (3.9.1: the classic
# group protocol only); each version's jars have their own directory.
version="${CANTER_KAFKA_VERSION:-}"
jars="${CANTER_KAFKA_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/canter/kafka-jars}${version:+-$version}"

die() { echo "kafka.sh: $*" >&2; exit 1; }

java_bin() {
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then echo "$JAVA_HOME/bin/java"; return; fi
  if command -v java >/dev/null 2>&1; then command -v java; return; fi
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -q openjdk-17-jre-headless >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q openjdk-17-jre-headless >/dev/null 2>&1; }; } \
    || die "no java, and apt-get could not install openjdk-17-jre-headless"
  command -v java || die "no java after installing openjdk-17-jre-headless"
}

fetch() {
  local stamp="$jars/.complete-$(sha1sum "$here/pom.xml" | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  command -v mvn >/dev/null 2>&1 || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q maven >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q maven >/dev/null 2>&1; } \
      || die "no mvn, and apt-get could not install maven"
  }
  rm -rf "$jars.tmp"
  mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies ${version:+-Dkafka.version=$version} \
    -DoutputDirectory="$jars.tmp" -DincludeScope=runtime >&2 \
    || die "mvn could not fetch Kafka's jars from Maven Central (tools/kafka/pom.xml)"
  rm -rf "$jars"
  mv "$jars.tmp" "$jars"
  touch "$stamp"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Two consecutive free ports per node would be luck; take each one separately.
start_node() {
  local dir="$1" i="$2"
  local node="$dir/node-$i"
  (
    cd "$node"
    # shellcheck disable=SC2086
    exec "$(java_bin)" -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -Djava.awt.headless=true -Dlog4j2.configurationFile="$dir/log4j2.properties" \
      -cp "$jars/*" kafka.Kafka "$node/server.properties"
  ) >>"$node/log" 2>&1 &
  echo $! >"$node/pid"
}

wait_ready() {
  local dir="$1" n="$2" deadline=$((SECONDS + ${CANTER_KAFKA_START_TIMEOUT:-90}))
  for ((i = 1; i <= n; i++)); do
    local node="$dir/node-$i"
    until grep -q "Kafka Server started" "$node/log" 2>/dev/null; do
      if ! kill -0 "$(cat "$node/pid")" 2>/dev/null; then
        tail -30 "$node/log" >&2
        die "node $i exited before it served (log above: $node/log)"
      fi
      if ((SECONDS > deadline)); then
        tail -30 "$node/log" >&2
        die "node $i did not serve within ${CANTER_KAFKA_START_TIMEOUT:-90} s (log: $node/log)"
      fi
      sleep 0.2
    done
  done
}

start() {
  local dir="" n=1 port="" watch="" secure="" reauth="" protocols_line=""
  heap=512m
  dir="$1"; shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --brokers) n="$2"; shift 2 ;;
      --port) port="$2"; shift 2 ;;
      --watch) watch="$2"; shift 2 ;;
      --heap) heap="$2"; shift 2 ;;
      --secure) secure="$(cd "$2" && pwd)" || die "no directory $2"; shift 2 ;;
      --reauth-ms) reauth="$2"; shift 2 ;;
      --classic-only) protocols_line="group.coordinator.rebalance.protocols=classic"; shift ;;
      *) die "unknown option $1" ;;
    esac
  done
  fetch
  java_bin >/dev/null
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  cat >"$dir/log4j2.properties" <<'EOF'
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.org.name = org.apache.kafka
logger.org.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
EOF
  local voters="" bports=() cports=()
  for ((i = 1; i <= n; i++)); do
    if [ -n "$port" ]; then bports[i]=$((port + i - 1)); else bports[i]=$(free_port); fi
    cports[i]=$(free_port)
    voters+="${voters:+,}$i@127.0.0.1:${cports[i]}"
  done
  local l_sasl_ssl="" l_ssl="" l_sasl_plain=""
  if [ -n "$secure" ]; then
    for f in localhost.keystore.pem ip.keystore.pem client-ca.pem; do
      [ -f "$secure/$f" ] || die "--secure $secure: no $f"
    done
  fi
  local rf=$((n < 3 ? n : 3)) isr=$((n < 3 ? 1 : 2)) bootstrap=""
  for ((i = 1; i <= n; i++)); do
    local node="$dir/node-$i"
    mkdir -p "$node/data"
    : >"$node/log"
    bootstrap+="${bootstrap:+,}127.0.0.1:${bports[i]}"
    local listeners="PLAINTEXT://127.0.0.1:${bports[i]},CONTROLLER://127.0.0.1:${cports[i]}"
    local advertised="PLAINTEXT://127.0.0.1:${bports[i]}"
    local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    if [ -n "$secure" ]; then
      local sasl_ssl ssl sasl_plain
      sasl_ssl=$(free_port); ssl=$(free_port); sasl_plain=$(free_port)
      listeners+=",SASL_SSL://127.0.0.1:$sasl_ssl,SSL://127.0.0.1:$ssl,SASL_PLAINTEXT://127.0.0.1:$sasl_plain"
      advertised+=",SASL_SSL://localhost:$sasl_ssl,SSL://127.0.0.1:$ssl,SASL_PLAINTEXT://127.0.0.1:$sasl_plain"
      protocols+=",SASL_SSL:SASL_SSL,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"
      l_sasl_ssl+="${l_sasl_ssl:+,}localhost:$sasl_ssl"
      l_ssl+="${l_ssl:+,}127.0.0.1:$ssl"
      l_sasl_plain+="${l_sasl_plain:+,}127.0.0.1:$sasl_plain"
    fi
    cat >"$node/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
log.dirs=$node/data
num.partitions=4
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=8
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
group.consumer.heartbeat.interval.ms=500
group.consumer.min.heartbeat.interval.ms=100
group.consumer.session.timeout.ms=6000
group.consumer.min.session.timeout.ms=1000
group.min.session.timeout.ms=1000
$protocols_line
auto.create.topics.enable=false
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
log.cleaner.backoff.ms=1000
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=2
num.io.threads=4
EOF
    if [ -n "$secure" ]; then
      local plain='org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
      local scram='org.apache.kafka.common.security.scram.ScramLoginModule required;'
      cat >>"$node/server.properties" <<EOF
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=$plain
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$scram
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$scram
listener.name.sasl_plaintext.plain.sasl.jaas.config=$plain
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=$scram
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=$scram
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$secure/localhost.keystore.pem
listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$secure/ip.keystore.pem
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$secure/client-ca.pem
listener.name.ssl.ssl.client.auth=required
EOF
      if [ -n "$reauth" ]; then
        printf 'listener.name.sasl_ssl.connections.max.reauth.ms=%s\nlistener.name.sasl_plaintext.connections.max.reauth.ms=%s\n' \
          "$reauth" "$reauth" >>"$node/server.properties"
      fi
    fi
  done
  if [ -n "$secure" ]; then
    printf 'sasl_ssl=%s\nssl=%s\nsasl_plaintext=%s\n' "$l_sasl_ssl" "$l_ssl" "$l_sasl_plain" \
      >"$dir/listeners"
  fi
  local scram_users=()
  if [ -n "$secure" ]; then
    scram_users=(--add-scram 'SCRAM-SHA-256=[name=alice,password=alice-secret]'
      --add-scram 'SCRAM-SHA-512=[name=alice,password=alice-secret]'
      --add-scram 'SCRAM-SHA-256=[name=bob,password=bob-secret]'
      --add-scram 'SCRAM-SHA-512=[name=bob,password=bob-secret]')
  fi
  local cluster
  cluster="$("$(java_bin)" -cp "$jars/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
  for ((i = 1; i <= n; i++)); do
    "$(java_bin)" -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$jars/*" \
      kafka.tools.StorageTool format -t "$cluster" -c "$dir/node-$i/server.properties" \
      --ignore-formatted "${scram_users[@]}" >>"$dir/node-$i/log" 2>&1 || { tail -20 "$dir/node-$i/log" >&2; die "format of node $i failed"; }
  done
  echo "$heap" >"$dir/heap"
  echo "$jars" >"$dir/jars"
  for ((i = 1; i <= n; i++)); do start_node "$dir" "$i"; done
  echo "$bootstrap" >"$dir/bootstrap"
  echo "$n" >"$dir/nodes"
  if [ -n "$watch" ]; then
    # Stops the cluster when the process that asked for it is gone, however it ended.
    ( trap '' HUP; while kill -0 "$watch" 2>/dev/null; do sleep 1; done; "$0" stop "$dir"; rm -rf "$dir" ) \
      </dev/null >/dev/null 2>&1 &
  fi
  wait_ready "$dir" "$n"
  echo "$bootstrap"
}

stop() {
  local dir="$1" pids=()
  for pidfile in "$dir"/node-*/pid; do
    [ -f "$pidfile" ] || continue
    local pid; pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  local deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

case "${1:-}" in
  fetch) fetch; echo "$jars" ;;
  start) shift; [ $# -ge 1 ] || die "start DIR [options]"; start "$@" ;;
  stop) [ $# -ge 2 ] || die "stop DIR"; stop "$2" ;;
  kill) [ $# -ge 3 ] || die "kill DIR NODE [SIGNAL]"; kill -"${4:-KILL}" "$(cat "$2/node-$3/pid")" ;;
  restart)
    [ $# -ge 3 ] || die "restart DIR NODE"
    # An absolute path: the node's JVM runs in its own directory.
    dir="$(cd "$2" && pwd)" || die "no directory $2"
    [ -d "$dir/node-$3" ] || die "no node $3 in $dir"
    heap="$(cat "$dir/heap")"
    [ -f "$dir/jars" ] && jars="$(cat "$dir/jars")"
    sed -i '/Kafka Server started/d' "$dir/node-$3/log"
    start_node "$dir" "$3"
    node="$dir/node-$3"
    deadline=$((SECONDS + ${CANTER_KAFKA_START_TIMEOUT:-90}))
    until grep -q "Kafka Server started" "$node/log"; do
      if ! kill -0 "$(cat "$node/pid")" 2>/dev/null; then
        tail -30 "$node/log" >&2
        die "node $3 exited before it served again (log above: $node/log)"
      fi
      ((SECONDS > deadline)) && die "node $3 did not serve again within ${CANTER_KAFKA_START_TIMEOUT:-90} s"
      sleep 0.2
    done
    ;;
  run)
    [ $# -ge 3 ] || die "run DIR CLASS ARGS..."
    [ -f "$2/jars" ] && jars="$(cat "$2/jars")"
    shift 2
    fetch
    # The tools log warnings and errors only, to stderr.
    quiet="$jars/log4j2-tools.properties"
    [ -f "$quiet" ] || printf '%s\n' 'rootLogger.level = WARN' 'rootLogger.appenderRef.err.ref = ERR' \
      'appender.err.type = Console' 'appender.err.name = ERR' 'appender.err.target = SYSTEM_ERR' \
      'appender.err.layout.type = PatternLayout' 'appender.err.layout.pattern = %p %m (%c)%n' >"$quiet"
    exec "$(java_bin)" -Dlog4j2.configurationFile="$quiet" -cp "$jars/*" "$@"
    ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
