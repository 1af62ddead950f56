//! What a generation is given to reach MCP servers through its worker's gateway
//! (`mcp_gateway.rs`): its own token, and — for the servers its profile is granted and this
//! worker offers, and only those — a configuration its CLI reads, whose every server is the
//! stdio bridge (`mcp-bridge.mjs`) to the gateway's socket.

use squadron_core::ids::McpServerId;
use squadron_core::provider::Provider;
use squadron_pki::{SecretToken, TokenKind};

use crate::agent::attempt::{AGENT_RUN_MOUNT, BROKER_MOUNT};
use crate::agent::mcp_gateway::MCP_SOCKET_NAME;
use crate::agent::stream_capsule::read_run_file;

/// The generation's gateway token, a run file (the provider's `/mnt/run`).
pub(crate) const MCP_TOKEN_FILE: &str = "mcp-token";
/// Claude Code's `--mcp-config`.
pub(crate) const MCP_CONFIG_FILE: &str = "mcp.json";
pub(crate) const MCP_BRIDGE_FILE: &str = "mcp-bridge.mjs";
const MCP_BRIDGE_SCRIPT: &str = include_str!("mcp-bridge.mjs");
/// Longest token file read back when a restarted worker adopts a running generation.
const MCP_TOKEN_BYTES_MAX: u64 = 256;

/// One generation's access to MCP.
pub(crate) struct McpAccess {
    pub(crate) token: SecretToken,
    /// Granted to the profile and offered here, in order.
    pub(crate) servers: Vec<McpServerId>,
}

impl McpAccess {
    pub(crate) fn new(servers: Vec<McpServerId>) -> McpAccess {
        McpAccess {
            token: SecretToken::generate(TokenKind::Mcp),
            servers,
        }
    }

    /// The token a running generation was given, read back from its run directory after
    /// the worker restarted; `None` when it is missing or not a gateway token.
    pub(crate) fn adopted_token(run_dir: &std::path::Path) -> Option<SecretToken> {
        let bytes = read_run_file(&run_dir.join(MCP_TOKEN_FILE), MCP_TOKEN_BYTES_MAX)?;
        let text = String::from_utf8(bytes).ok()?;
        SecretToken::parse(TokenKind::Mcp, &text).ok()
    }

    /// The launch files: the token, the configuration (empty when nothing is granted), and
    /// when any server is listed, the bridge.
    pub(crate) fn run_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files = vec![
            (MCP_TOKEN_FILE.to_owned(), self.token.expose().into_bytes()),
            (
                MCP_CONFIG_FILE.to_owned(),
                self.claude_config().into_bytes(),
            ),
        ];
        if !self.servers.is_empty() {
            files.push((
                MCP_BRIDGE_FILE.to_owned(),
                MCP_BRIDGE_SCRIPT.as_bytes().to_vec(),
            ));
        }
        files
    }

    /// Where every provider (a script too) finds the gateway: paths only, never the token.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "SQUADRON_MCP_SOCKET".to_owned(),
                format!("{BROKER_MOUNT}/{MCP_SOCKET_NAME}"),
            ),
            (
                "SQUADRON_MCP_TOKEN_FILE".to_owned(),
                format!("{AGENT_RUN_MOUNT}/{MCP_TOKEN_FILE}"),
            ),
        ];
        env.push((
            "SQUADRON_MCP_CONFIG".to_owned(),
            format!("{AGENT_RUN_MOUNT}/{MCP_CONFIG_FILE}"),
        ));
        env
    }

    /// Adds the CLI's MCP words: Claude Code always reads the configuration and nothing else
    /// (`--strict-mcp-config`: no server of a repository's `.mcp.json` or the user's settings
    /// is started, even when nothing is granted); Codex takes each granted server as
    /// `-c mcp_servers.NAME…` overrides, before its prompt's `-`.
    pub(crate) fn insert_into(&self, provider: Provider, argv: &mut Vec<String>) {
        match provider {
            Provider::Claude => argv.extend([
                "--mcp-config".to_owned(),
                format!("{AGENT_RUN_MOUNT}/{MCP_CONFIG_FILE}"),
                "--strict-mcp-config".to_owned(),
            ]),
            Provider::Codex if !self.servers.is_empty() => {
                let at = argv.iter().rposition(|a| a == "-").unwrap_or(argv.len());
                let words: Vec<String> = self
                    .servers
                    .iter()
                    .flat_map(|s| {
                        [
                            "-c".to_owned(),
                            format!("mcp_servers.{s}.command=\"node\""),
                            "-c".to_owned(),
                            format!("mcp_servers.{s}.args={}", bridge_args(s)),
                        ]
                    })
                    .collect();
                argv.splice(at..at, words);
            }
            Provider::Codex | Provider::Script => {}
        }
    }

    fn claude_config(&self) -> String {
        let servers: serde_json::Map<String, serde_json::Value> = self
            .servers
            .iter()
            .map(|s| {
                (
                    s.to_string(),
                    serde_json::json!({
                        "type": "stdio",
                        "command": "node",
                        "args": [format!("{AGENT_RUN_MOUNT}/{MCP_BRIDGE_FILE}"), s.as_str()],
                    }),
                )
            })
            .collect();
        serde_json::json!({ "mcpServers": servers }).to_string()
    }
}

/// The bridge's arguments as a TOML array (JSON's string syntax is TOML's for these: a
/// server id is letters, digits, `-` and `_`).
fn bridge_args(server: &McpServerId) -> String {
    serde_json::json!([
        format!("{AGENT_RUN_MOUNT}/{MCP_BRIDGE_FILE}"),
        server.as_str()
    ])
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(servers: &[&str]) -> McpAccess {
        McpAccess::new(
            servers
                .iter()
                .map(|s| McpServerId::new(*s).expect("id"))
                .collect(),
        )
    }

    #[test]
    fn only_the_listed_servers_are_configured_and_the_token_is_no_argument() {
        let a = access(&["notes"]);
        let files = a.run_files();
        let config: serde_json::Value = serde_json::from_slice(&files[1].1).expect("json");
        assert_eq!(
            config["mcpServers"]["notes"]["args"],
            serde_json::json!(["/mnt/run/mcp-bridge.mjs", "notes"])
        );
        assert_eq!(config["mcpServers"].as_object().expect("map").len(), 1);
        let mut claude = vec!["claude".to_owned(), "--print".to_owned()];
        a.insert_into(Provider::Claude, &mut claude);
        assert_eq!(
            claude[2..],
            ["--mcp-config", "/mnt/run/mcp.json", "--strict-mcp-config"]
        );
        let mut codex: Vec<String> = ["codex", "exec", "--json", "-"].map(String::from).to_vec();
        a.insert_into(Provider::Codex, &mut codex);
        assert_eq!(codex.last().map(String::as_str), Some("-"));
        assert!(codex.contains(&"mcp_servers.notes.command=\"node\"".to_owned()));
        assert!(codex.contains(
            &"mcp_servers.notes.args=[\"/mnt/run/mcp-bridge.mjs\",\"notes\"]".to_owned()
        ));
        let token = a.token.expose();
        for word in claude.iter().chain(&codex) {
            assert!(!word.contains(&token));
        }
        for (_, value) in a.env() {
            assert!(!value.contains(&token));
        }
    }

    #[test]
    fn without_a_granted_server_claude_code_gets_an_empty_strict_configuration() {
        let a = access(&[]);
        let files = a.run_files();
        let names: Vec<_> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [MCP_TOKEN_FILE, MCP_CONFIG_FILE]);
        let config: serde_json::Value = serde_json::from_slice(&files[1].1).expect("json");
        assert_eq!(config, serde_json::json!({"mcpServers": {}}));
        let mut argv = vec!["claude".to_owned()];
        a.insert_into(Provider::Claude, &mut argv);
        assert_eq!(
            argv,
            [
                "claude",
                "--mcp-config",
                "/mnt/run/mcp.json",
                "--strict-mcp-config"
            ]
        );
        let mut argv = vec!["codex".to_owned(), "-".to_owned()];
        a.insert_into(Provider::Codex, &mut argv);
        assert_eq!(argv, ["codex", "-"]);
    }

    #[test]
    fn an_adopted_generation_keeps_its_token() {
        let dir = tempfile::tempdir().expect("dir");
        let a = access(&[]);
        std::fs::write(dir.path().join(MCP_TOKEN_FILE), a.token.expose()).expect("write");
        let back = McpAccess::adopted_token(dir.path()).expect("token");
        assert_eq!(back.expose(), a.token.expose());
        std::fs::write(dir.path().join(MCP_TOKEN_FILE), "sqd_op_x").expect("write");
        assert!(McpAccess::adopted_token(dir.path()).is_none());
    }
}
