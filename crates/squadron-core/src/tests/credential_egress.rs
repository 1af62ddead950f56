//! INV-13, egress injection: only an admin binds a live credential to its upstream; a bad
//! binding names its field and changes nothing; revocation drops the binding; a manifest
//! whose sandbox cannot take an injected credential is refused naming the field.

use super::*;
use crate::command::{PutCredential, RevokeCredential, SetCredentialEgress};
use crate::credential::{SealedSecret, SEALED_NONCE_BYTES};
use crate::credential_egress::EgressBinding;
use crate::ids::CredentialId;
use crate::snapshot::{decode_snapshot, encode_snapshot};

const REFS: &str = "startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
    session: { launcher: l, workdir: /workspace, cols: 80, rows: 24 }\n  \
    credential_refs:\n    - { id: cred_a, mount: anthropic_api_key }\n  \
    readiness: { probes: [] }\n  \
    observation: { retention_class: short, redaction_profile: credentials }\n";

fn cid(s: &str) -> CredentialId {
    CredentialId::new(s).unwrap()
}

fn put(fx: &mut Fx, id: &str) {
    fx.ok(Command::PutCredential(PutCredential {
        id: cid(id),
        description: String::new(),
        sealed: SealedSecret {
            key_id: "0123456789abcdef".into(),
            nonce: vec![1; SEALED_NONCE_BYTES],
            ciphertext: vec![1; 40],
        },
    }));
}

fn binding() -> EgressBinding {
    EgressBinding {
        upstream: "https://api.anthropic.com".into(),
        header: "x-api-key".into(),
        value_prefix: String::new(),
    }
}

fn set(id: &str, egress: Option<EgressBinding>) -> Command {
    Command::SetCredentialEgress(SetCredentialEgress {
        id: cid(id),
        egress,
    })
}

fn invalid_field(r: Rejection) -> String {
    match r {
        Rejection::Invalid(e) => e.field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn inv_13_only_an_admin_binds_a_live_credential_and_bad_bindings_change_nothing() {
    let mut fx = Fx::new();
    let unknown = fx.rejected(set("cred_a", Some(binding())));
    assert!(matches!(unknown, Rejection::NotFound { .. }), "{unknown:?}");
    put(&mut fx, "cred_a");
    let denied = fx.rejected_as(&Subject::Worker(worker()), set("cred_a", Some(binding())));
    assert!(
        matches!(denied, Rejection::PermissionDenied { .. }),
        "{denied:?}"
    );
    let mut plain_http = binding();
    plain_http.upstream = "http://api.anthropic.com".into();
    assert_eq!(
        invalid_field(fx.rejected(set("cred_a", Some(plain_http)))),
        "egress.upstream"
    );
    let mut host = binding();
    host.header = "host".into();
    assert_eq!(
        invalid_field(fx.rejected(set("cred_a", Some(host)))),
        "egress.header"
    );

    assert_eq!(
        fx.ok(set("cred_a", Some(binding()))),
        Outcome::CredentialEgressSet {
            id: cid("cred_a"),
            bound: true
        }
    );
    assert_eq!(fx.state.credential_egress(&cid("cred_a")), Some(&binding()));
    let bytes = encode_snapshot(&fx.state);
    assert_eq!(decode_snapshot(&bytes).unwrap(), fx.state);

    fx.ok(set("cred_a", None));
    assert_eq!(fx.state.credential_egress(&cid("cred_a")), None);
    fx.ok(set("cred_a", Some(binding())));
    fx.ok(Command::RevokeCredential(RevokeCredential {
        id: cid("cred_a"),
    }));
    assert_eq!(
        fx.state.credential_egress(&cid("cred_a")),
        None,
        "a revoked credential keeps no binding"
    );
    let revoked = fx.rejected(set("cred_a", Some(binding())));
    assert!(
        matches!(revoked, Rejection::CredentialRevoked { .. }),
        "{revoked:?}"
    );
}

#[test]
fn inv_13_a_sandbox_that_cannot_take_an_injected_credential_is_refused_naming_the_field() {
    let mut fx = Fx::new();
    put(&mut fx, "cred_a");
    let outbound = spec(REFS);
    assert_eq!(fx.state.check_credential_refs(&outbound), Ok(()));
    fx.ok(set("cred_a", Some(binding())));
    assert_eq!(fx.state.check_credential_refs(&outbound), Ok(()));
    for runtime in ["process", "docker", "kvm"] {
        for mode in ["gateway", "isolated", "outbound"] {
            let own = spec(&format!(
                "{REFS}sandbox:\n  runtime: {runtime}\n  network_mode: {mode}\n"
            ));
            let checked = fx.state.check_credential_refs(&own);
            assert_eq!(checked, Ok(()), "{runtime} {mode}");
        }
    }
    // A guest's proxy is reached over its agent's channel, whatever its network.
    let kvm_full = spec(&format!(
        "{REFS}sandbox:\n  runtime: kvm\n  network_mode: full\n"
    ));
    assert_eq!(fx.state.check_credential_refs(&kvm_full), Ok(()));
    for (sandbox, field) in [
        ("sandbox:\n  network_mode: full\n", "vm.network_mode"),
        (
            "sandbox:\n  runtime: docker\n  network_mode: full\n",
            "vm.network_mode",
        ),
    ] {
        let refused = fx
            .state
            .check_credential_refs(&spec(&format!("{REFS}{sandbox}")))
            .unwrap_err();
        assert_eq!(invalid_field(refused), field, "{sandbox}");
    }
    // Unbound again, the same manifests are fine: the file goes into any sandbox.
    fx.ok(set("cred_a", None));
    let full = spec(&format!("{REFS}sandbox:\n  network_mode: full\n"));
    assert_eq!(fx.state.check_credential_refs(&full), Ok(()));
}
