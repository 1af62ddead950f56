//! Rules of a decoded spec and of its keyword values, apart from any document.

use super::*;
use serde::Serialize;
use std::fmt;

#[test]
fn validate_rechecks_decoded_specs() {
    let good = parse_manifest_yaml(SEED).unwrap();
    type Tamper = fn(&mut TaskSpec);
    let cases: [(Tamper, &str); 9] = [
        (|s| s.agent.prompt.clear(), "agent.prompt"),
        (|s| s.sandbox.memory_bytes = Some(1), "vm.memory"),
        (
            |s| s.priority = TaskPriority::Low,
            "metadata.labels.priority",
        ),
        (|s| s.lifecycle.timeout_ms = 0, "lifecycle.timeout"),
        (
            |s| s.lifecycle.success_exit_codes = vec![1, 1],
            "lifecycle.success_exit_codes[1]",
        ),
        (
            |s| s.lifecycle.retries.clone.backoff_ms.clear(),
            "lifecycle.retries.clone.backoff",
        ),
        (
            |s| s.repository.url = "https://u:p@h/r".into(),
            "repository.url",
        ),
        (
            |s| {
                let sp = s.startup_profile.as_mut().unwrap();
                sp.credential_refs[1].mount = sp.credential_refs[0].mount.clone();
            },
            "startup_profile.credential_refs[1].mount",
        ),
        (|s| s.agent.script = Some("x".into()), "agent.script"),
    ];
    for (tamper, field) in cases {
        let mut spec = good.clone();
        tamper(&mut spec);
        assert_eq!(spec.validate().unwrap_err().field, field);
    }
}

#[test]
fn bincode_refuses_malformed_ids() {
    #[derive(Serialize)]
    struct Fake {
        id: String,
        mount: String,
    }
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(
        Fake {
            id: "Not An Id".into(),
            mount: "m".into(),
        },
        config,
    )
    .unwrap();
    let decoded: Result<(CredentialRef, usize), _> =
        bincode::serde::decode_from_slice(&bytes, config);
    assert!(decoded.is_err());
}

#[test]
fn retry_delays_repeat_the_last_entry() {
    let spec = RetrySpec::new(3, &[5_000, 10_000, 20_000]);
    assert_eq!(spec.delay_ms(0), 5_000);
    assert_eq!(spec.delay_ms(1), 5_000);
    assert_eq!(spec.delay_ms(2), 10_000);
    assert_eq!(spec.delay_ms(3), 20_000);
    assert_eq!(spec.delay_ms(4), 20_000);
    assert_eq!(spec.delay_ms(u32::MAX), 20_000);
    assert_eq!(RetrySpec::new(1, &[]).delay_ms(1), 0);
    let connect = RetryPolicy::default().agent_connect;
    let total: u64 = (1..=connect.max).map(|n| connect.delay_ms(n)).sum();
    assert_eq!(total, 60_000);
}

#[test]
fn priorities_order_and_rank() {
    use TaskPriority::*;
    assert!(Low < Normal && Normal < High && High < Critical);
    let ranks: Vec<u8> = TaskPriority::ALL.iter().map(|p| p.rank()).collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
    assert_eq!(TaskPriority::default(), Normal);
}

#[test]
fn keyword_names_match_serde_names() {
    fn check<T: Serialize + Copy + fmt::Display>(all: &[T]) {
        for v in all {
            assert_eq!(serde_json::to_value(v).unwrap(), v.to_string());
        }
    }
    check(TaskPriority::ALL);
    check(NetworkMode::ALL);
    check(RuntimeKind::ALL);
    check(FailureAction::ALL);
    check(StartupTrigger::ALL);
    assert_eq!(
        RuntimeKind::parse("runtime", "docker"),
        Ok(RuntimeKind::Docker)
    );
    assert_eq!("kvm".parse::<RuntimeKind>(), Ok(RuntimeKind::Kvm));
    assert_eq!(
        RuntimeKind::parse("vm.runtime", "lxc").unwrap_err().field,
        "vm.runtime"
    );
}
