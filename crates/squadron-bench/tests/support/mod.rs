//! Finding the binaries the comparison tests start.

use std::path::PathBuf;

use squadron_bench::ETCD_BIN_DEFAULT;

/// The `squadron` binary: `SQUADRON_BIN`, else `<target>/<profile>/squadron` beside this test's
/// `deps` directory. Fails with how to get it when it is missing.
pub fn squadron_bin() -> PathBuf {
    let bin = match std::env::var_os("SQUADRON_BIN") {
        Some(path) => PathBuf::from(path),
        None => {
            // <target>/debug/deps/<test>-<hash> → <target>/debug/squadron
            let exe = std::env::current_exe().expect("current_exe");
            exe.parent()
                .and_then(|deps| deps.parent())
                .map(|profile| profile.join("squadron"))
                .expect("the test executable lives in <target>/<profile>/deps")
        }
    };
    assert!(
        bin.is_file(),
        "the squadron binary is missing at {} (run `cargo build -p squadron` with the same \
         target dir, or set SQUADRON_BIN)",
        bin.display()
    );
    bin
}

/// etcd, where Debian's `etcd-server` package puts it.
#[allow(dead_code)] // each test file compiles this module; not all of them start etcd
pub fn etcd_bin() -> PathBuf {
    let etcd = PathBuf::from(ETCD_BIN_DEFAULT);
    assert!(
        etcd.is_file(),
        "etcd is missing at {ETCD_BIN_DEFAULT} (apt-get install etcd-server)"
    );
    etcd
}
