//! `deploy/` holds what it says: the systemd units pass `systemd-analyze verify` with no
//! warning (the binary path pointed at the one under test), and every flag a unit passes is one
//! the binary's own `--help` lists, so a renamed flag breaks this test, not a user's host.

mod support;

use std::path::Path;
use std::process::Command;

use support::BIN;

const UNITS: [(&str, &str); 2] = [
    ("squadron-node.service", "server"),
    ("squadron-worker.service", "worker"),
];

fn deploy(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The unit's `ExecStart=` line.
fn exec_start(unit: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line")
        .to_string()
}

#[test]
fn the_systemd_units_verify_without_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, _) in UNITS {
        let unit = deploy(&format!("systemd/{name}")).replace("/usr/local/bin/squadron", BIN);
        let path = dir.path().join(name);
        std::fs::write(&path, unit).expect("write the unit");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze (systemd)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "{name}: exit {}, {stderr}",
            out.status
        );
    }
}

#[test]
fn every_flag_a_unit_passes_is_one_the_binary_takes() {
    for (name, command) in UNITS {
        let line = exec_start(&deploy(&format!("systemd/{name}")));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.get(1), Some(&command), "{name}: {line}");
        let help = Command::new(BIN)
            .args([command, "--help"])
            .output()
            .expect("squadron --help");
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in words.iter().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{name} passes {flag}, which `squadron {command} --help` does not list"
            );
        }
    }
}

#[test]
fn the_worker_env_example_sets_every_variable_the_worker_unit_reads() {
    let unit = deploy("systemd/squadron-worker.service");
    let env = deploy("systemd/worker.env.example");
    let set: Vec<&str> = env
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    for var in exec_start(&unit)
        .split("${")
        .skip(1)
        .filter_map(|s| s.split_once('}').map(|(v, _)| v))
    {
        assert!(set.contains(&var), "worker.env.example does not set {var}");
    }
}
