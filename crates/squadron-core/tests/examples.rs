//! The manifests under `examples/` are valid: the README's tour submits them.

use squadron_core::manifest::parse_manifest_yaml;

#[test]
fn every_example_manifest_parses() {
    // Read at run time (cargo sets it, and runs tests in the package directory): the build
    // directory is shared by clones at different paths, so a compiled-in path could be stale.
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let dir = std::path::Path::new(&root).join("../../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("read");
            parse_manifest_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(
        seen >= 2,
        "expected the process and docker examples, found {seen}"
    );
}
