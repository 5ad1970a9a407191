//! HPACK against the examples of RFC 7541, Appendix C, and encoder/decoder round trips.

#![allow(clippy::unwrap_used)]

use canter_h2::hpack::{DecodeError, Decoder, Encoder, Indexing};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

type Fields = Vec<(String, String)>;

fn decode(d: &mut Decoder, block: &[u8]) -> Fields {
    let mut out = Vec::new();
    let r = d
        .decode(block, 1 << 20, |n, v| {
            out.push((
                String::from_utf8(n.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            ))
        })
        .unwrap();
    assert!(!r.over_limit);
    out
}

fn f(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn requests(blocks: [&str; 3]) {
    let mut d = Decoder::new(4096);
    assert_eq!(
        decode(&mut d, &hex(blocks[0])),
        f(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(d.table_size(), 57);
    assert_eq!(
        decode(&mut d, &hex(blocks[1])),
        f(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache")
        ])
    );
    assert_eq!(d.table_size(), 110);
    assert_eq!(
        decode(&mut d, &hex(blocks[2])),
        f(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value")
        ])
    );
    assert_eq!(d.table_size(), 164);
}

#[test]
fn c3_requests_without_huffman() {
    requests([
        "828684410f7777772e6578616d706c652e636f6d",
        "828684be58086e6f2d6361636865",
        "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
    ]);
}

#[test]
fn c4_requests_with_huffman() {
    requests([
        "828684418cf1e3c2e5f23a6ba0ab90f4ff",
        "828684be5886a8eb10649cbf",
        "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
    ]);
}

fn responses(blocks: [&str; 3]) {
    // The examples use a 256-byte table, so entries get evicted.
    let mut d = Decoder::new(256);
    let first = f(&[
        (":status", "302"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("location", "https://www.example.com"),
    ]);
    assert_eq!(decode(&mut d, &hex(blocks[0])), first);
    assert_eq!(d.table_size(), 222);
    let mut second = first.clone();
    second[0].1 = "307".into();
    assert_eq!(decode(&mut d, &hex(blocks[1])), second);
    assert_eq!(d.table_size(), 222);
    assert_eq!(
        decode(&mut d, &hex(blocks[2])),
        f(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", "https://www.example.com"),
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
            ),
        ])
    );
    assert_eq!(d.table_size(), 215);
}

#[test]
fn c5_responses_without_huffman() {
    responses([
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
        "4803333037c1c0bf",
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31",
    ]);
}

#[test]
fn c6_responses_with_huffman() {
    responses([
        "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
        "4883640effc1c0bf",
        "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
    ]);
}

#[test]
fn c1_integers() {
    // C.1.2: 1337 with a 5-bit prefix, as a table size update: allowed under 4096, refused
    // under 1000. C.1.3: 42 at an octet boundary, as an index: out of range.
    let mut d = Decoder::new(4096);
    assert!(d.decode(&hex("3f9a0a"), 4096, |_, _| {}).is_ok());
    let mut small = Decoder::new(1000);
    assert_eq!(
        small.decode(&hex("3f9a0a"), 4096, |_, _| {}),
        Err(DecodeError::BadSizeUpdate)
    );
    assert_eq!(
        d.decode(&hex("bf0b"), 4096, |_, _| {}),
        Err(DecodeError::BadIndex)
    );
}

#[test]
fn bad_blocks_are_refused() {
    let mut d = Decoder::new(4096);
    // Index 0.
    assert_eq!(
        d.decode(&[0x80], 4096, |_, _| {}),
        Err(DecodeError::BadIndex)
    );
    // Past the static table with an empty dynamic table.
    assert_eq!(
        d.decode(&[0xbe], 4096, |_, _| {}),
        Err(DecodeError::BadIndex)
    );
    // A literal cut short.
    assert_eq!(
        d.decode(&[0x40, 0x05, b'a'], 4096, |_, _| {}),
        Err(DecodeError::Truncated)
    );
    // An integer that never ends.
    assert_eq!(
        d.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], 4096, |_, _| {}),
        Err(DecodeError::IntegerOverflow)
    );
    // A size update above the advertised table size, and one after a field.
    assert_eq!(
        d.decode(&[0x3f, 0xe2, 0x1f], 4096, |_, _| {}),
        Err(DecodeError::BadSizeUpdate)
    );
    assert_eq!(
        d.decode(&[0x82, 0x20], 4096, |_, _| {}),
        Err(DecodeError::BadSizeUpdate)
    );
    // A Huffman string padded with a zero bit.
    assert_eq!(
        d.decode(&[0x40, 0x81, 0x18, 0x81, 0x1f], 4096, |_, _| {}),
        Err(DecodeError::BadHuffman)
    );
}

#[test]
fn header_list_limit_counts_decoded_size_and_keeps_the_table_in_step() {
    let mut enc = Encoder::new(4096);
    let mut block = Vec::new();
    let big = "x".repeat(3000);
    enc.field(b"a", big.as_bytes(), Indexing::Yes, &mut block);
    enc.field(b"b", b"after", Indexing::Yes, &mut block);
    let mut d = Decoder::new(4096);
    let mut seen = Vec::new();
    let r = d
        .decode(&block, 1000, |n, _| seen.push(n.to_vec()))
        .unwrap();
    assert!(r.over_limit);
    assert_eq!(r.list_size, 1 + 3000 + 32 + 1 + 5 + 32);
    assert!(seen.is_empty());
    // The entries were inserted all the same: the next block can refer to them.
    let mut next = Vec::new();
    enc.field(b"b", b"after", Indexing::Yes, &mut next);
    assert_eq!(next.len(), 1);
    assert_eq!(decode(&mut d, &next), f(&[("b", "after")]));
}

#[test]
fn a_small_bomb_is_bounded_by_the_list_limit() {
    // One 4000-byte entry referenced 1000 times: 4 MB decoded from a 1 KB block.
    let mut enc = Encoder::new(4096);
    let mut block = Vec::new();
    let v = "y".repeat(4000);
    enc.field(b"k", v.as_bytes(), Indexing::No, &mut block);
    let mut d = Decoder::new(4096);
    let mut blk = vec![0x40, 0x01, b'k'];
    blk.extend_from_slice(&[0x7f, 0xa1, 0x1e]); // length 4000 (127 + 3873)
    blk.extend_from_slice(v.as_bytes());
    blk.extend(std::iter::repeat_n(0xbe, 1000));
    let mut count = 0;
    let r = d.decode(&blk, 16 * 1024, |_, _| count += 1).unwrap();
    assert!(r.over_limit);
    assert!(count <= 4, "{count} fields handed out");
    assert_eq!(r.list_size, 1001 * (4001 + 32));
}

#[test]
fn encoder_round_trips_and_indexes_repeats() {
    let mut enc = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let fields: &[(&[u8], &[u8])] = &[
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"server", b"canter"),
        (b"date", b"Wed, 25 Nov 2026 12:00:00 GMT"),
        (b"x-custom", b"value with spaces & symbols \xff\x00"),
    ];
    let mut sizes = Vec::new();
    for _ in 0..3 {
        let mut block = Vec::new();
        enc.begin(&mut block);
        enc.status(200, &mut block);
        enc.status(418, &mut block);
        for (n, v) in fields {
            enc.field(n, v, Indexing::Yes, &mut block);
        }
        enc.field(b"set-cookie", b"secret", Indexing::Never, &mut block);
        let mut got = Vec::new();
        d.decode(&block, 1 << 20, |n, v| got.push((n.to_vec(), v.to_vec())))
            .unwrap();
        assert_eq!(got[0], (b":status".to_vec(), b"200".to_vec()));
        assert_eq!(got[1], (b":status".to_vec(), b"418".to_vec()));
        for (i, (n, v)) in fields.iter().enumerate() {
            assert_eq!(got[i + 2], (n.to_vec(), v.to_vec()));
        }
        assert_eq!(got[6], (b"set-cookie".to_vec(), b"secret".to_vec()));
        sizes.push(block.len());
    }
    // Once indexed, each repeated field is one byte; the never-indexed one is sent again.
    assert_eq!(sizes[1], sizes[2]);
    assert!(sizes[1] < 16, "{sizes:?}");
}

#[test]
fn encoder_follows_a_smaller_peer_table() {
    let mut enc = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let mut block = Vec::new();
    enc.field(b"x-a", b"1", Indexing::Yes, &mut block);
    d.decode(&block, 4096, |_, _| {}).unwrap();
    // The peer shrinks its table to 0 then allows 100: the next block announces both sizes.
    enc.set_max_table(0);
    enc.set_max_table(100);
    let mut block = Vec::new();
    enc.begin(&mut block);
    enc.field(b"x-a", b"1", Indexing::Yes, &mut block);
    assert_eq!(&block[..2], &[0x20, 0x3f]);
    let mut got = Vec::new();
    d.decode(&block, 4096, |n, v| got.push((n.to_vec(), v.to_vec())))
        .unwrap();
    assert_eq!(got, vec![(b"x-a".to_vec(), b"1".to_vec())]);
    assert_eq!(d.table_size(), 3 + 1 + 32);
}

/// A small deterministic generator (xorshift), so the test needs no crate.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn random_blocks_never_panic_and_errors_are_errors() {
    // Any byte a peer sends reaches the decoder: it must answer with a value or an error.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..20_000 {
        let len = (xorshift(&mut seed) % 64) as usize;
        let mut block: Vec<u8> = (0..len).map(|_| xorshift(&mut seed) as u8).collect();
        // Half of the blocks start like real ones (indexed or literal with a Huffman string).
        if round % 2 == 0 && !block.is_empty() {
            block[0] = [0x82, 0x40, 0x00, 0x10][round % 4];
        }
        let mut d = Decoder::new(4096);
        let _ = d.decode(&block, 1 << 12, |_, _| {});
        // The same decoder goes on working (or keeps failing) without panicking.
        let _ = d.decode(&block, 1 << 12, |_, _| {});
    }
}
