//! What several of the pipeline library's test binaries share.

/// `(key, value)` records crossing a group's processes: the key and the value,
/// little-endian, 12 bytes a record.
pub struct PairWire;

impl canter_stream::pipeline::Wire<u32, (u32, u64)> for PairWire {
    fn encode(&self, items: Vec<(u32, (u32, u64))>, out: &mut Vec<u8>) -> Result<(), String> {
        for (k, (_, v)) in items {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    fn decode(&self, bytes: &[u8], out: &mut Vec<(u32, (u32, u64))>) -> Result<(), String> {
        if !bytes.len().is_multiple_of(12) {
            return Err(format!("{} bytes", bytes.len()));
        }
        for c in bytes.chunks_exact(12) {
            let k = u32::from_le_bytes(c[..4].try_into().map_err(|_| "short")?);
            let v = u64::from_le_bytes(c[4..].try_into().map_err(|_| "short")?);
            out.push((k, (k, v)));
        }
        Ok(())
    }
}
