package bench;

import java.nio.ByteBuffer;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * Market Spread written the way a Kafka Streams user would: the NBBO topic is a table of each
 * symbol's last quote (materialized, with its changelog), the orders stream is left-joined to
 * it, and every order whose symbol's spread rejects it (or that has no quote yet) becomes a
 * 55-byte result on the results topic, keyed by symbol. Same records as canter's TCP form
 * without their length prefix.
 *
 * Usage: MarketSpread BOOTSTRAP APPLICATION_ID [THREADS] [COMMIT_MS] [NBBO] [ORDERS] [RESULTS]
 */
public final class MarketSpread {
    private static boolean rejects(double bid, double offer) {
        double spread = offer - bid;
        return spread >= 0.05 || spread / ((bid + offer) / 2.0) >= 0.05;
    }

    static byte[] check(byte[] order, byte[] quote) {
        boolean reject = true;
        double bid = 0, offer = 0;
        if (quote != null && quote.length == 42 && quote[0] == 2) {
            ByteBuffer q = ByteBuffer.wrap(quote);
            bid = q.getDouble(26);
            offer = q.getDouble(34);
            reject = rejects(bid, offer);
        }
        if (!reject || order == null || order.length != 53 || order[0] != 1) {
            return null;
        }
        ByteBuffer out = ByteBuffer.allocate(55);
        out.put(order[1]);                 // side
        out.put(order, 2, 4);              // account
        out.put(order, 6, 6);              // order id
        out.put(order, 12, 4);             // symbol
        out.put(order, 16, 16);            // quantity, price
        out.putDouble(bid);
        out.putDouble(offer);
        out.putLong(System.currentTimeMillis() * 1_000_000L);
        return out.array();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String app = args[1];
        int threads = args.length > 2 ? Integer.parseInt(args[2]) : 1;
        int commitMs = args.length > 3 ? Integer.parseInt(args[3]) : 100;
        String nbbo = args.length > 4 ? args[4] : "nbbo";
        String orders = args.length > 5 ? args[5] : "orders";
        String results = args.length > 6 ? args[6] : "results";
        // at_least_once (Kafka Streams' default) or exactly_once_v2.
        String guarantee = args.length > 7 ? args[7] : StreamsConfig.AT_LEAST_ONCE;

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        p.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/kstreams-" + app);
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder b = new StreamsBuilder();
        KTable<byte[], byte[]> quotes = b.table(nbbo,
            Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()),
            Materialized.as("symbols"));
        KStream<byte[], byte[]> orderStream = b.stream(orders,
            Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()));
        orderStream
            .leftJoin(quotes, MarketSpread::check)
            .filter((k, v) -> v != null)
            .to(results, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.err.println("market-spread streams: RUNNING");
            }
        });
        streams.start();
        done.await();
    }
}
