//! A throwaway PKI for TLS tests: a CA, server certificates it signs, and client certificates
//! from a second CA, written as PEM files into a temporary directory removed on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};

/// A certificate and its key on disk, with the certificate's DER for comparisons.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// PEM certificate chain (leaf, then the CA).
    pub cert: PathBuf,
    /// PEM private key (PKCS#8).
    pub key: PathBuf,
    /// The leaf certificate, DER.
    pub der: Vec<u8>,
    /// The leaf's public key (SubjectPublicKeyInfo), DER.
    pub spki: Vec<u8>,
}

impl CertFiles {
    /// SHA-256 fingerprint of the leaf, as colon-separated upper-case hex pairs.
    pub fn sha256(&self) -> String {
        fingerprint(&self.der)
    }

    /// SHA-256 of the leaf's public key, base64: what Chromium's
    /// `--ignore-certificate-errors-spki-list` takes.
    pub fn spki_sha256_base64(&self) -> String {
        use base64::Engine;
        let digest = ring::digest::digest(&ring::digest::SHA256, &self.spki);
        base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
    }
}

/// SHA-256 fingerprint of `der`, as colon-separated upper-case hex pairs.
pub fn fingerprint(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A server CA and a client CA in a temporary directory.
pub struct Pki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
    client_ca: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish()
    }
}

fn make_ca(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    (Issuer::new(params, key), cert.pem())
}

impl Pki {
    /// Makes the two CAs and writes `ca.pem` and `client-ca.pem`.
    pub fn new() -> Pki {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "canter-pki-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        let (ca, ca_pem) = make_ca("canter test CA");
        let (client_ca, client_pem) = make_ca("canter test client CA");
        fs::write(dir.join("ca.pem"), &ca_pem).unwrap();
        fs::write(dir.join("client-ca.pem"), client_pem).unwrap();
        Pki {
            dir,
            ca,
            ca_pem,
            client_ca,
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server CA's certificate (PEM file).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The client CA's certificate (PEM file).
    pub fn client_ca(&self) -> PathBuf {
        self.dir.join("client-ca.pem")
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by the CA, written
    /// as `<stem>.pem` (chain) and `<stem>.key`.
    pub fn server(&self, stem: &str, names: &[&str]) -> CertFiles {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        for name in names {
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into().unwrap()),
            });
        }
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.ca).unwrap();
        self.write(
            stem,
            &format!("{}{}", cert.pem(), self.ca_pem),
            &key,
            cert.der(),
        )
    }

    /// A client certificate for `name`, signed by the client CA.
    pub fn client(&self, stem: &str, name: &str) -> CertFiles {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.client_ca).unwrap();
        self.write(stem, &cert.pem(), &key, cert.der())
    }

    fn write(&self, stem: &str, chain: &str, key: &KeyPair, der: &[u8]) -> CertFiles {
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}.key")),
            der: der.to_vec(),
            spki: rcgen::PublicKeyData::subject_public_key_info(key),
        };
        fs::write(&files.cert, chain).unwrap();
        fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
