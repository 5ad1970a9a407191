//! SASL client mechanisms, sans-IO: the bytes each step sends and what it checks in the
//! broker's answers. PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677) with the
//! server's signature verified, as Kafka's brokers speak them inside SaslAuthenticate.

use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};

use crate::security::Mechanism;

/// What went wrong in an exchange: the broker's message does not parse, or the server's
/// signature is not the one the password gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslError(pub String);

/// One client's side of an authentication exchange.
pub(crate) enum Exchange {
    /// PLAIN: one message, no answer to check.
    Plain { first: Vec<u8> },
    /// SCRAM: client-first, then the proof, then the server's signature checked.
    Scram(Scram),
}

impl Exchange {
    /// Starts an exchange with a fresh client nonce.
    pub(crate) fn start(mechanism: Mechanism, user: &str, password: &str) -> Exchange {
        match mechanism {
            Mechanism::Plain => {
                let mut first = Vec::with_capacity(user.len() + password.len() + 2);
                first.push(0);
                first.extend_from_slice(user.as_bytes());
                first.push(0);
                first.extend_from_slice(password.as_bytes());
                Exchange::Plain { first }
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                Exchange::Scram(Scram::new(mechanism, user, password, &nonce()))
            }
        }
    }

    /// The first message.
    pub(crate) fn first(&self) -> Vec<u8> {
        match self {
            Exchange::Plain { first } => first.clone(),
            Exchange::Scram(s) => s.client_first(),
        }
    }

    /// The answer to the broker's `challenge` (`None`: the exchange is complete, after the
    /// final message was checked).
    pub(crate) fn step(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>, SaslError> {
        match self {
            Exchange::Plain { .. } => Ok(None),
            Exchange::Scram(s) => s.step(challenge),
        }
    }
}

/// 24 random bytes, base64: the client's nonce.
fn nonce() -> String {
    let mut bytes = [0u8; 24];
    // A system without a random source cannot make TLS either; an all-zero nonce would still
    // authenticate (the server adds its own) but must never happen silently.
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

enum ScramState {
    Initial,
    /// The proof was sent; the server's signature is expected.
    ProofSent {
        server_signature: Vec<u8>,
    },
    Done,
}

/// A SCRAM client (RFC 5802) without channel binding (`n,,`).
pub(crate) struct Scram {
    mechanism: Mechanism,
    user: String,
    password: String,
    client_nonce: String,
    state: ScramState,
}

impl Scram {
    pub(crate) fn new(mechanism: Mechanism, user: &str, password: &str, nonce: &str) -> Scram {
        Scram {
            mechanism,
            user: user.replace('=', "=3D").replace(',', "=2C"),
            password: password.to_owned(),
            client_nonce: nonce.to_owned(),
            state: ScramState::Initial,
        }
    }

    fn bare(&self) -> String {
        format!("n={},r={}", self.user, self.client_nonce)
    }

    pub(crate) fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.bare()).into_bytes()
    }

    fn algorithms(
        &self,
    ) -> (
        pbkdf2::Algorithm,
        hmac::Algorithm,
        &'static digest::Algorithm,
    ) {
        match self.mechanism {
            Mechanism::ScramSha512 => (
                pbkdf2::PBKDF2_HMAC_SHA512,
                hmac::HMAC_SHA512,
                &digest::SHA512,
            ),
            _ => (
                pbkdf2::PBKDF2_HMAC_SHA256,
                hmac::HMAC_SHA256,
                &digest::SHA256,
            ),
        }
    }

    pub(crate) fn step(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>, SaslError> {
        let text = std::str::from_utf8(challenge)
            .map_err(|_| SaslError("the broker's SCRAM message is not UTF-8".into()))?;
        match std::mem::replace(&mut self.state, ScramState::Done) {
            ScramState::Initial => {
                let (reply, server_signature) = self.client_final(text)?;
                self.state = ScramState::ProofSent { server_signature };
                Ok(Some(reply))
            }
            ScramState::ProofSent { server_signature } => {
                if let Some(e) = attribute(text, 'e') {
                    return Err(SaslError(format!("the broker refused the proof: {e}")));
                }
                let v = attribute(text, 'v').ok_or_else(|| {
                    SaslError(format!(
                        "SCRAM server-final message without a signature: {text}"
                    ))
                })?;
                let got = base64::engine::general_purpose::STANDARD
                    .decode(v)
                    .map_err(|_| SaslError("the server signature is not base64".into()))?;
                // Not a secret comparison: the signature is public once sent.
                if got != server_signature {
                    return Err(SaslError(
                        "the broker's SCRAM signature is wrong: it does not know the password \
                         (not the broker it claims to be?)"
                            .into(),
                    ));
                }
                Ok(None)
            }
            ScramState::Done => Err(SaslError("SCRAM exchange already complete".into())),
        }
    }

    /// The client-final message for `server_first`, and the server signature to expect.
    fn client_final(&self, server_first: &str) -> Result<(Vec<u8>, Vec<u8>), SaslError> {
        if let Some(e) = attribute(server_first, 'e') {
            return Err(SaslError(format!("the broker refused: {e}")));
        }
        let bad = |what: &str| SaslError(format!("SCRAM server-first message {what}"));
        let nonce = attribute(server_first, 'r').ok_or_else(|| bad("has no nonce"))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(bad("has a nonce that does not extend the client's"));
        }
        let salt = attribute(server_first, 's')
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .ok_or_else(|| bad("has no usable salt"))?;
        let iterations = attribute(server_first, 'i')
            .and_then(|i| i.parse::<u32>().ok())
            .and_then(std::num::NonZeroU32::new)
            .ok_or_else(|| bad("has no usable iteration count"))?;
        // Kafka brokers use 4096 or more; bound what a broker can make us compute.
        if iterations.get() > 1_000_000 {
            return Err(bad("asks for over a million iterations"));
        }
        let (kdf, mac, hash) = self.algorithms();
        let mut salted = vec![0u8; hash.output_len()];
        pbkdf2::derive(
            kdf,
            iterations,
            &salt,
            self.password.as_bytes(),
            &mut salted,
        );
        let salted_key = hmac::Key::new(mac, &salted);
        let client_key = hmac::sign(&salted_key, b"Client Key");
        let stored_key = digest::digest(hash, client_key.as_ref());
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.bare());
        let client_signature = hmac::sign(
            &hmac::Key::new(mac, stored_key.as_ref()),
            auth_message.as_bytes(),
        );
        let proof: Vec<u8> = client_key
            .as_ref()
            .iter()
            .zip(client_signature.as_ref())
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = hmac::sign(&salted_key, b"Server Key");
        let server_signature = hmac::sign(
            &hmac::Key::new(mac, server_key.as_ref()),
            auth_message.as_bytes(),
        );
        let reply = format!(
            "{without_proof},p={}",
            base64::engine::general_purpose::STANDARD.encode(proof)
        );
        Ok((reply.into_bytes(), server_signature.as_ref().to_vec()))
    }
}

/// The value of attribute `name` (`name=value`) in a SCRAM message.
fn attribute(message: &str, name: char) -> Option<&str> {
    message.split(',').find_map(|part| {
        let mut chars = part.chars();
        (chars.next() == Some(name) && chars.next() == Some('=')).then(|| &part[2..])
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// RFC 7677 section 3's example exchange, byte for byte.
    #[test]
    fn scram_sha_256_matches_rfc_7677() {
        let mut s = Scram::new(
            Mechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        );
        assert_eq!(s.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let reply = s
            .step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap()
            .unwrap();
        assert_eq!(
            String::from_utf8(reply).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(
            s.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .unwrap(),
            None
        );
    }

    #[test]
    fn a_wrong_server_signature_is_refused() {
        let mut s = Scram::new(
            Mechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        );
        s.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        let e = s
            .step(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap_err();
        assert!(e.0.contains("signature is wrong"), "{e:?}");
    }

    #[test]
    fn a_server_nonce_that_does_not_extend_ours_is_refused() {
        let mut s = Scram::new(Mechanism::ScramSha512, "user", "pencil", "abc");
        let e = s.step(b"r=xyzdef,s=QUJD,i=4096").unwrap_err();
        assert!(e.0.contains("nonce"), "{e:?}");
        let mut s = Scram::new(Mechanism::ScramSha512, "user", "pencil", "abc");
        assert!(s.step(b"r=abc,s=QUJD,i=4096").is_err());
    }

    #[test]
    fn user_names_are_escaped() {
        let s = Scram::new(Mechanism::ScramSha256, "a=b,c", "p", "n");
        assert_eq!(s.client_first(), b"n,,n=a=3Db=2Cc,r=n");
    }

    #[test]
    fn plain_is_authzid_user_password() {
        let e = Exchange::start(Mechanism::Plain, "alice", "secret");
        assert_eq!(e.first(), b"\0alice\0secret");
    }
}
