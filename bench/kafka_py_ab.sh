#!/usr/bin/env bash
# A/B of canter-py on Kafka (Market Spread, python/examples/market_spread.py): two
# installations of the package, 3 rounds of 500,000 records in alternating order, each round a
# bench/kafka.py run of its own (its broker, its placement and CPU per record).
#   bench/kafka_py_ab.sh OLD_PYTHON NEW_PYTHON
OLD=$(realpath -s "${1:?usage: bench/kafka_py_ab.sh OLD_PYTHON NEW_PYTHON}")
NEW=$(realpath -s "${2:?usage: bench/kafka_py_ab.sh OLD_PYTHON NEW_PYTHON}")
cd "$(dirname "$0")/.."
for r in 1 2 3; do
  for v in old new; do
    # Odd rounds old first, even rounds new first.
    if [ $((r % 2)) = 1 ]; then [ $v = old ] && py=$OLD || py=$NEW
    else [ $v = old ] && { py=$NEW; v=new; } || { py=$OLD; v=old; }; fi
    echo "== round $r $v ($py)"
    CANTER_PY=$py python3 bench/kafka.py --records 500000 --rounds 1 --pipelines canter-py \
      --no-summary --no-ceiling --latency-seconds 0 --failover-symbols "" 2>&1 | grep -E "canter-py" | head -5
  done
done
