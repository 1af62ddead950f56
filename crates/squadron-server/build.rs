//! Installs the dashboard's front-end dependencies from npm, exactly as `dashboard/package-lock.json`
//! pins them (`npm ci` checks each package's sha512), and copies their built files into
//! OUT_DIR, where `src/dashboard.rs` embeds them: the binary serves them itself, so a node's
//! dashboard fetches nothing from anywhere else at run time.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the page loads, by the name it is served under and its path in `node_modules`.
const ASSETS: [(&str, &str); 3] = [
    ("xterm.js", "@xterm/xterm/lib/xterm.js"),
    ("xterm.css", "@xterm/xterm/css/xterm.css"),
    ("addon-fit.js", "@xterm/addon-fit/lib/addon-fit.js"),
];
/// Whose licences travel with the files (both MIT, which asks for its notice to be kept).
const LICENSES: [(&str, &str); 2] = [
    ("@xterm/xterm", "@xterm/xterm/LICENSE"),
    ("@xterm/addon-fit", "@xterm/addon-fit/LICENSE"),
];

type Failure = Box<dyn std::error::Error>;

// CARGO_MANIFEST_DIR is read at run time and the rerun paths are relative to the package: the
// build directory is shared between clones at different paths.
fn main() -> Result<(), Failure> {
    println!("cargo:rerun-if-changed=dashboard/package.json");
    println!("cargo:rerun-if-changed=dashboard/package-lock.json");
    let source = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("dashboard");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let install = out.join("dashboard-npm");
    std::fs::create_dir_all(&install)?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(source.join(file), install.join(file))?;
    }
    npm_ci(&install)?;
    let modules = install.join("node_modules");
    for (name, path) in ASSETS {
        let text = std::fs::read_to_string(modules.join(path))?;
        std::fs::write(out.join(name), without_source_map(&text))?;
    }
    let mut notices = String::new();
    for (package, path) in LICENSES {
        let text = std::fs::read_to_string(modules.join(path))?;
        notices.push_str(&format!("{package}\n\n{text}\n\n"));
    }
    std::fs::write(out.join("LICENSES.txt"), notices)?;
    Ok(())
}

/// `npm ci` in `dir`: the lock file's versions, their integrity checked, no install scripts.
/// npm's own cache serves a package it already holds, so a rebuild needs no registry.
fn npm_ci(dir: &Path) -> Result<(), Failure> {
    let status = Command::new("npm")
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--prefer-offline",
            "--loglevel=error",
        ])
        .current_dir(dir)
        .status()
        .map_err(|e| {
            format!(
                "the dashboard's terminal (xterm.js) comes from npm at build time, and npm could \
                 not be run ({e}); install it (apt-get install npm) or use scripts/dev or \
                 scripts/test, which do"
            )
        })?;
    if !status.success() {
        return Err(format!(
            "npm ci of crates/squadron-server/dashboard failed ({status}): the dashboard's \
             front-end packages are fetched from the npm registry (or npm's cache) at build time"
        )
        .into());
    }
    Ok(())
}

/// The files name a source map the node does not serve; a browser's developer tools would ask
/// for it and log the 404.
fn without_source_map(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("//# sourceMappingURL="))
        .collect::<Vec<_>>()
        .join("\n")
}
