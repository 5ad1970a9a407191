#!/usr/bin/env bash
# A/B of the Rust Kafka pipeline (Market Spread, `canter pipeline market-spread --kafka`): two
# builds of canter, 3 rounds of 1,000,000 records in alternating order, at-least-once and
# exactly-once, each round a bench/kafka.py run of its own (its broker, its placement and CPU
# per record).
#   bench/kafka_ab.sh OLD_CANTER NEW_CANTER
OLD=$(realpath -s "${1:?usage: bench/kafka_ab.sh OLD_CANTER NEW_CANTER}")
NEW=$(realpath -s "${2:?usage: bench/kafka_ab.sh OLD_CANTER NEW_CANTER}")
cd "$(dirname "$0")/.."
for r in 1 2 3; do
  for v in old new; do
    # Odd rounds old first, even rounds new first.
    if [ $((r % 2)) = 1 ]; then [ $v = old ] && bin=$OLD || bin=$NEW
    else [ $v = old ] && { bin=$NEW; v=new; } || { bin=$OLD; v=old; }; fi
    echo "== round $r $v ($bin)"
    CANTER_BIN=$bin python3 bench/kafka.py --records 1000000 --rounds 1 --pipelines canter,canter-eos \
      --no-summary --no-ceiling --latency-seconds 0 --failover-symbols "" 2>&1 | grep -E "^round"
  done
done
