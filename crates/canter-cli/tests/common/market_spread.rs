//! Market Spread's independent reference: the results computed from the rule and the record
//! layouts in the test code itself, not with the generator's or the pipeline's code.

/// The frames of a file, as records.
pub fn unframe(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let len = u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        out.push(&data[at + 4..at + 4 + len]);
        at += 4 + len;
    }
    out
}

/// Market Spread computed here, from the rule in the issue and the record layouts, byte offsets
/// written out again (not the generator's code): per symbol {reject: true, bid: 0, offer: 0},
/// quotes applied in stream order ahead of the orders (the generator keeps each symbol's quote
/// fixed, so any interleaving after the first quotes gives the same), one 55-byte result per
/// rejected order, timestamp 0.
pub fn reference(nbbo: &[u8], orders: &[u8]) -> Vec<u8> {
    let f = |b: &[u8], at: usize| f64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    let mut state: std::collections::HashMap<[u8; 4], (bool, f64, f64)> = Default::default();
    for q in unframe(nbbo) {
        assert_eq!((q.len(), q[0]), (42, 2));
        let (bid, offer) = (f(q, 26), f(q, 34));
        let spread = offer - bid;
        let reject = spread >= 0.05 || spread / ((bid + offer) / 2.0) >= 0.05;
        state.insert(q[1..5].try_into().unwrap(), (reject, bid, offer));
    }
    let mut out = Vec::new();
    for o in unframe(orders) {
        assert_eq!((o.len(), o[0]), (53, 1));
        let symbol: [u8; 4] = o[12..16].try_into().unwrap();
        let (reject, bid, offer) = state.get(&symbol).copied().unwrap_or((true, 0.0, 0.0));
        if reject {
            out.extend_from_slice(&55u32.to_be_bytes());
            out.push(o[1]); // side
            out.extend_from_slice(&o[2..6]); // account
            out.extend_from_slice(&o[6..12]); // order id
            out.extend_from_slice(&symbol);
            out.extend_from_slice(&o[16..32]); // quantity, price
            out.extend_from_slice(&bid.to_be_bytes());
            out.extend_from_slice(&offer.to_be_bytes());
            out.extend_from_slice(&0u64.to_be_bytes());
        }
    }
    out
}
