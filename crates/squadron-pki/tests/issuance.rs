//! What the CA signs, and what it refuses.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use squadron_core::ids::WorkerId;
use squadron_pki::{
    CertFacts, CertUse, ClusterCa, IssuedCert, KeyRequest, PkiDir, SpiffeId, SubjectName,
};

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn a_csr_gets_the_identity_the_ca_grants_not_the_one_it_asks_for() {
    let (ca, _) = ClusterCa::generate("t").unwrap();
    // The enrolling side asks to be node 1.
    let request = KeyRequest::new(&SpiffeId::Node(1)).unwrap();
    let granted = SpiffeId::Worker(WorkerId::new("w1").unwrap());
    let pem = ca
        .sign_csr(
            &request.csr_pem,
            &granted,
            &[],
            HOUR,
            CertUse::ServerAndClient,
        )
        .unwrap();
    let facts = IssuedCert::new(pem, request.key_pem().into(), ca.cert_pem())
        .facts()
        .unwrap();
    assert_eq!(facts.identity, granted);
    let lifetime = facts.not_after_ms - facts.not_before_ms;
    // One hour plus the backdating for clock skew.
    assert!(
        (3_600_000..=3_600_000 + 10 * 60_000).contains(&lifetime),
        "{lifetime}"
    );
}

#[test]
fn bad_csrs_and_validities_are_refused() {
    let (ca, _) = ClusterCa::generate("t").unwrap();
    let id = SpiffeId::Worker(WorkerId::new("w1").unwrap());
    let request = KeyRequest::new(&id).unwrap();
    for bad in ["", "garbage", &"A".repeat(20_000)] {
        assert!(ca.sign_csr(bad, &id, &[], HOUR, CertUse::Client).is_err());
    }
    // A CSR whose signature does not match its key (one byte flipped in the body).
    let mut tampered = request.csr_pem.clone().into_bytes();
    let i = tampered.len() / 2;
    tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert!(ca
        .sign_csr(&tampered, &id, &[], HOUR, CertUse::Client)
        .is_err());
    assert!(ca
        .sign_csr(
            &request.csr_pem,
            &id,
            &[],
            Duration::from_secs(1),
            CertUse::Client
        )
        .is_err());
    assert!(ca
        .sign_csr(&request.csr_pem, &id, &[], 30 * 24 * HOUR, CertUse::Client)
        .is_err());
}

#[test]
fn a_ca_round_trips_through_its_files_and_a_leaf_is_not_a_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = PkiDir::of_data_dir(dir.path());
    let (ca, key) = ClusterCa::generate("t").unwrap();
    pki.write_ca(ca.cert_pem(), &key).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(pki.ca_key()).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let again = ClusterCa::from_pem(
        &std::fs::read_to_string(pki.ca_cert()).unwrap(),
        &squadron_pki::pki_dir::read_secret_file(&pki.ca_key()).unwrap(),
    )
    .unwrap();
    let leaf = again
        .issue(
            &SpiffeId::Node(2),
            &[SubjectName::of_host("[::1]:80")],
            HOUR,
            CertUse::ServerAndClient,
        )
        .unwrap();
    assert_eq!(leaf.facts().unwrap().identity, SpiffeId::Node(2));
    pki.write_identity("node", &leaf).unwrap();
    let read = pki.read_identity("node").unwrap();
    assert_eq!(read.cert_pem, leaf.cert_pem);
    // A leaf offered as the CA is refused.
    assert!(ClusterCa::from_pem(&leaf.cert_pem, leaf.key_pem()).is_err());
    // A key others can read is refused.
    std::fs::set_permissions(
        pki.key("node"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let e = pki.read_identity("node").unwrap_err().to_string();
    assert!(e.contains("chmod 600"), "{e}");
}

#[test]
fn facts_name_the_identity_and_refuse_certificates_without_one() {
    let (ca, _) = ClusterCa::generate("t").unwrap();
    let leaf = ca
        .issue(&SpiffeId::Node(5), &[], HOUR, CertUse::ServerAndClient)
        .unwrap();
    let der = squadron_pki::peer_identity::first_cert_der(&leaf.cert_pem).unwrap();
    let facts = CertFacts::of_der(&der).unwrap();
    assert_eq!(facts.identity, SpiffeId::Node(5));
    assert!(!facts.serial_hex.is_empty());
    // The CA certificate itself carries no identity.
    let ca_der = squadron_pki::peer_identity::first_cert_der(ca.cert_pem()).unwrap();
    assert!(CertFacts::of_der(&ca_der).is_err());
}
