//! READY → RUNNING: the provider command a runtime starts, written as files in `run/`.
//!
//! - `prompt.txt`: the prompt, fed to the provider on standard input. It is never an
//!   argument and never part of `launch.sh` (argv is visible to every process of the host,
//!   and launch scripts end up in logs).
//! - `script.sh`: the manifest's script, for the `script` provider only.
//! - `launch.sh`: a POSIX `sh` script that points stdin at the prompt, appends stdout and
//!   stderr to the progress logs, enters the working directory and `exec`s the provider, so
//!   the runtime's signals (SIGTERM on cancel) reach the provider itself.
//!
//! Provider command lines (every argument shell-quoted):
//! - claude: `claude --print --output-format stream-json --verbose --permission-mode
//!   bypassPermissions [--model M] [--max-turns N] [--allowedTools a,b]` — stream-json needs
//!   `--verbose` in print mode; Squadron's sandbox is the boundary, and a headless run has
//!   nobody to grant a permission, so the CLI's own prompts are off (the CLI refuses this as
//!   root; sandboxed code never runs as root); an empty `allowed_tools` list adds no flag.
//!   `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` and `DISABLE_AUTOUPDATER=1` keep it from
//!   calling anything but the model; `ENABLE_TOOL_SEARCH=false` gives it its MCP tools whole. Its API key comes from the credential file
//!   `ANTHROPIC_API_KEY_FILE` (a `credential_refs` mount `anthropic_api_key`): the CLI takes
//!   the key only from its environment, so `launch.sh` moves it there, into the provider's
//!   environment alone (never a command line, never a file the worker writes).
//! - codex: `codex exec --json [--model M] --sandbox danger-full-access --skip-git-repo-check
//!   -` — its JSONL events as the task's stdout; `-` reads the prompt from stdin; `codex exec` is read-only by default, and Squadron's
//!   sandbox (bubblewrap, container or VM) is the boundary, so Codex's own nested sandbox,
//!   which often cannot start inside another, is turned off; the check for a trusted git
//!   repository is skipped because the working directory may be a subpath or a fresh clone.
//!   `max_turns` and `allowed_tools` have no Codex equivalent and are ignored. Its API key
//!   comes from `OPENAI_API_KEY_FILE` (mount `openai_api_key`) as `OPENAI_API_KEY` and
//!   `CODEX_API_KEY`; Codex reads no base-URL variable, so a worker's `OPENAI_BASE_URL` becomes
//!   a model provider in `$HOME/.codex/config.toml`.
//! - script: `/bin/sh /mnt/run/script.sh`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use squadron_core::manifest::{AgentSpec, ProbeSpec, TaskSpec};
use squadron_core::provider::Provider;

use crate::error::WorkerError;
use crate::support::remove_path;
use crate::support::write_atomic;
use crate::task::env_allowlist::EnvAllowlist;
use crate::task::task_dir::TaskDir;

/// Where the sandbox mounts the task's `run/`, `inbox/` and `outbox/` (see `task_dir`).
pub(crate) const SANDBOX_MOUNT_PREFIX: &str = "/mnt";
pub(crate) const LAUNCH_SCRIPT_NAME: &str = "launch.sh";
pub(crate) const PROMPT_FILE_NAME: &str = "prompt.txt";
pub(crate) const SCRIPT_FILE_NAME: &str = "script.sh";
/// What the sandbox's environment gets for credentials injected at egress (base URLs, the
/// placeholder), written when the lease is taken — after a sandbox agent's container or
/// guest was made — and read by `launch.sh` before anything else. The lease's holder writes
/// and removes it (`task/driver/credentials.rs`), never `launch.sh`'s writer: a sandbox
/// agent's `launch.sh` is written again while the provider starts.
pub(crate) const EGRESS_ENV_FILE_NAME: &str = "egress.env";
/// The sandbox's fixed environment, whatever the worker's own.
pub(crate) const SANDBOX_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
pub(crate) const SANDBOX_HOME: &str = "/tmp";
pub(crate) const SANDBOX_LANG: &str = "C.UTF-8";
pub(crate) const SANDBOX_TERM: &str = "dumb";
/// Claude Code's permission mode inside Squadron's sandbox (see the module documentation).
pub(crate) const CLAUDE_PERMISSION_MODE: &str = "bypassPermissions";
/// Codex's own sandbox mode inside Squadron's (see the module documentation).
pub(crate) const CODEX_SANDBOX_MODE: &str = "danger-full-access";
/// Longest working directory accepted.
pub(crate) const LAUNCH_WORKDIR_BYTES_MAX: usize = 4_096;
/// Exit status of `launch.sh` when the working directory cannot be entered.
pub(crate) const LAUNCH_WORKDIR_EXIT_CODE: i32 = 126;
/// Exit status of `launch.sh` when a readiness probe failed (the provider never started), and
/// how its line on stderr starts.
pub(crate) const READINESS_EXIT_CODE: i32 = 125;
pub(crate) const READINESS_FAILURE_PREFIX: &str = "squadron: readiness probe ";

/// What the runtime starts: `argv`, `env` and `workdir` go into its `LaunchSpec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LaunchPlan {
    /// `["/bin/sh", "/mnt/run/launch.sh"]`.
    pub(crate) argv: Vec<String>,
    /// The fixed base, `SQUADRON_TASK_ID`, `SQUADRON_ATTEMPT` and the allowlisted variables
    /// the worker has. Secrets among them are never written to disk by the launcher.
    pub(crate) env: BTreeMap<String, String>,
    /// Inside the sandbox.
    pub(crate) workdir: String,
    pub(crate) provider: Provider,
    /// The command `launch.sh` execs, for logs and events (the prompt is not in it).
    pub(crate) provider_argv: Vec<String>,
    /// `launch.sh` on the worker's side.
    pub(crate) launch_script: PathBuf,
}

/// Writes `run/{prompt.txt, script.sh, launch.sh}` for the standard sandbox mounts.
pub(crate) fn prepare_launch(
    dir: &TaskDir,
    attempt: u32,
    spec: &TaskSpec,
    workdir: &str,
    env_allowlist: &EnvAllowlist,
) -> Result<LaunchPlan, WorkerError> {
    prepare_launch_with_mounts(
        dir,
        attempt,
        spec,
        workdir,
        env_allowlist,
        SANDBOX_MOUNT_PREFIX,
    )
}

/// As [`prepare_launch`], with `run/`, `inbox/` and `outbox/` mounted under `mount_prefix`
/// instead of `/mnt` (a runtime with other mounts; tests run `launch.sh` on the host with
/// the task directory itself as the prefix). `workdir` must lie in `{mount_prefix}/inbox`.
pub(crate) fn prepare_launch_with_mounts(
    dir: &TaskDir,
    attempt: u32,
    spec: &TaskSpec,
    workdir: &str,
    env_allowlist: &EnvAllowlist,
    mount_prefix: &str,
) -> Result<LaunchPlan, WorkerError> {
    spec.validate().map_err(|e| WorkerError::Invalid {
        field: e.field,
        message: e.reason,
    })?;
    let prefix = mount_prefix.trim_end_matches('/');
    check_path("mount_prefix", mount_prefix)?;
    check_path("workdir", workdir)?;
    let inbox = format!("{prefix}/inbox");
    if workdir.trim_end_matches('/') != inbox && !workdir.starts_with(&format!("{inbox}/")) {
        return Err(WorkerError::Invalid {
            field: "workdir".into(),
            message: format!("{workdir:?} is not inside {inbox}"),
        });
    }
    let run = format!("{prefix}/run");
    let outbox = format!("{prefix}/outbox");
    let agent = &spec.agent;

    let run_host = dir.run();
    std::fs::create_dir_all(&run_host).map_err(|e| WorkerError::io("creating", &run_host, e))?;
    write_atomic(&run_host.join(PROMPT_FILE_NAME), agent.prompt.as_bytes())?;
    let script_host = run_host.join(SCRIPT_FILE_NAME);
    match (&agent.provider, &agent.script) {
        (Provider::Script, Some(script)) => write_atomic(&script_host, script.as_bytes())?,
        _ => remove_path(&script_host)?,
    }

    let provider_argv = provider_argv(agent, &run);
    let probes = spec
        .startup_profile
        .as_ref()
        .map(|p| p.readiness.probes.as_slice())
        .unwrap_or_default();
    let text = launch_script(
        dir,
        attempt,
        probes,
        agent.provider,
        &provider_argv,
        &LaunchPaths {
            prompt: format!("{run}/{PROMPT_FILE_NAME}"),
            egress_env: format!("{run}/{EGRESS_ENV_FILE_NAME}"),
            stdout: format!("{outbox}/progress/stdout.log"),
            stderr: format!("{outbox}/progress/stderr.log"),
            workdir,
        },
    )?;
    let launch_script = run_host.join(LAUNCH_SCRIPT_NAME);
    write_atomic(&launch_script, text.as_bytes())?;

    Ok(LaunchPlan {
        argv: vec!["/bin/sh".to_string(), format!("{run}/{LAUNCH_SCRIPT_NAME}")],
        env: sandbox_env(dir, attempt, agent.provider, env_allowlist),
        workdir: workdir.to_string(),
        provider: agent.provider,
        provider_argv,
        launch_script,
    })
}

/// The allowlisted variables the worker has, under the fixed base the launcher always sets.
fn sandbox_env(
    dir: &TaskDir,
    attempt: u32,
    provider: Provider,
    env_allowlist: &EnvAllowlist,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = env_allowlist.resolve();
    for (name, value) in provider_env(provider) {
        env.insert(name.to_string(), value.to_string());
    }
    for (name, value) in [
        ("PATH", SANDBOX_PATH.to_string()),
        ("HOME", SANDBOX_HOME.to_string()),
        ("LANG", SANDBOX_LANG.to_string()),
        ("TERM", SANDBOX_TERM.to_string()),
        ("SQUADRON_TASK_ID", dir.task().to_string()),
        ("SQUADRON_ATTEMPT", attempt.to_string()),
    ] {
        env.insert(name.to_string(), value);
    }
    env
}

/// What a provider's CLI always gets in its environment: no traffic but the model's.
pub(crate) fn provider_env(provider: Provider) -> &'static [(&'static str, &'static str)] {
    match provider {
        Provider::Claude => &[
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            // The MCP servers a sandbox gets are the few its grant names (agent/mcp_access.rs):
            // their tools go to the model whole, as the grant says, not behind a search step.
            ("ENABLE_TOOL_SEARCH", "false"),
        ],
        Provider::Codex | Provider::Script => &[],
    }
}

/// `launch.sh`'s readiness probes (the manifest's `startup_profile.readiness`), each a check
/// and, on failure, a line on stderr naming it and exit [`READINESS_EXIT_CODE`] before the
/// provider starts.
fn readiness_prelude(probes: &[ProbeSpec]) -> Result<String, WorkerError> {
    let mut text = String::new();
    for probe in probes {
        // A file, or the proxy's base URL when the credential is injected at egress.
        let credential = |file: &str, mount: &str| {
            let base = format!("{}_BASE_URL", mount.to_ascii_uppercase());
            (
                format!("[ -s \"${{{file}:-}}\" ] || [ -n \"${{{base}:-}}\" ]"),
                format!("no {mount} credential in the sandbox (startup_profile.credential_refs)"),
            )
        };
        let (check, why) = match (probe.provider.as_str(), probe.kind.as_str()) {
            ("claude", "auth") => credential("ANTHROPIC_API_KEY_FILE", "anthropic_api_key"),
            ("codex", "auth") => credential("OPENAI_API_KEY_FILE", "openai_api_key"),
            ("github", "repo_access") => credential("GITHUB_TOKEN_FILE", "github_token"),
            (cli @ ("claude" | "codex"), "cli") => (
                format!("{cli} --version >/dev/null 2>&1"),
                format!("{cli} --version did not run"),
            ),
            _ => (
                "false".to_string(),
                "this worker does not know the probe".to_string(),
            ),
        };
        let line = format!(
            "{READINESS_FAILURE_PREFIX}{}/{} failed: {why}",
            probe.provider, probe.kind
        );
        text.push_str(&format!(
            "{check} || {{ echo {} >&2; exit {READINESS_EXIT_CODE}; }}\n",
            quote(&line)?
        ));
    }
    if !text.is_empty() {
        text.insert_str(
            0,
            "# Readiness probes: the provider starts only once every one holds.\n",
        );
    }
    Ok(text)
}

/// `launch.sh`'s lines that give Codex the worker's `OPENAI_BASE_URL` as its model provider.
const CODEX_BASE_URL_PRELUDE: &str = r#"# OPENAI_BASE_URL (the worker's setting) as Codex's model provider.
if [ -n "${OPENAI_BASE_URL:-}" ]; then mkdir -p "$HOME/.codex" && printf '%s\n' 'model_provider = "squadron"' '[model_providers.squadron]' 'name = "squadron"' "base_url = \"$OPENAI_BASE_URL\"" 'env_key = "OPENAI_API_KEY"' 'wire_api = "responses"' >"$HOME/.codex/config.toml" || exit 1; fi
"#;

/// What `launch.sh` does for a provider's CLI before it starts it: the API key moved from its
/// credential file into the variables the CLI reads it from (neither CLI reads a key from a
/// file), and for Codex, which has no base-URL variable, `OPENAI_BASE_URL` made a model
/// provider in its own configuration (`$HOME` is the sandbox's private `/tmp`).
pub(crate) fn provider_prelude(provider: Provider) -> String {
    let move_key = |file: &str, vars: &[&str]| {
        let assign: String = vars
            .iter()
            .map(|v| format!(" {v}=$(cat \"${{{file}}}\") || exit 1; export {v};"))
            .collect();
        format!(
            "# The API key moves from its credential file into this process's environment only.\n\
             if [ -n \"${{{file}:-}}\" ]; then{assign} fi\n"
        )
    };
    match provider {
        Provider::Claude => move_key("ANTHROPIC_API_KEY_FILE", &["ANTHROPIC_API_KEY"]),
        Provider::Codex => {
            let key = move_key("OPENAI_API_KEY_FILE", &["OPENAI_API_KEY", "CODEX_API_KEY"]);
            format!("{key}{CODEX_BASE_URL_PRELUDE}")
        }
        Provider::Script => String::new(),
    }
}

/// The provider's command line (no prompt: that comes on stdin). `run` is where `run/` is
/// mounted.
pub(crate) fn provider_argv(agent: &AgentSpec, run: &str) -> Vec<String> {
    match agent.provider {
        Provider::Script => vec!["/bin/sh".into(), format!("{run}/{SCRIPT_FILE_NAME}")],
        cli => cli_argv(cli, agent),
    }
}

/// A headless CLI's command line: a task's with its manifest's model, turns and tools; an
/// agent profile's with none of them (`AgentSpec`'s optional fields unset).
pub(crate) fn cli_argv(provider: Provider, agent: &AgentSpec) -> Vec<String> {
    let mut argv: Vec<String> = Vec::new();
    let mut push = |args: &[&str]| argv.extend(args.iter().map(|a| a.to_string()));
    match provider {
        Provider::Claude => {
            push(&[
                "claude",
                "--print",
                "--output-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                CLAUDE_PERMISSION_MODE,
            ]);
            if let Some(model) = &agent.model {
                push(&["--model", model]);
            }
            if let Some(turns) = agent.max_turns {
                push(&["--max-turns", &turns.to_string()]);
            }
            if let Some(tools) = agent.allowed_tools.as_ref().filter(|t| !t.is_empty()) {
                push(&["--allowedTools", &tools.join(",")]);
            }
        }
        Provider::Codex => {
            push(&["codex", "exec", "--json"]);
            if let Some(model) = &agent.model {
                push(&["--model", model]);
            }
            push(&[
                "--sandbox",
                CODEX_SANDBOX_MODE,
                "--skip-git-repo-check",
                "-",
            ]);
        }
        Provider::Script => {}
    }
    argv
}

/// A shell script that starts `provider`'s CLI headless as an agent profile's provider: the
/// key moved from its credential file and Codex's model provider from `OPENAI_BASE_URL` (as
/// `launch.sh` does for a task), then the CLI itself, so signals reach it. `edit` adds to the
/// command line (the words that resume the CLI's own session).
pub(crate) fn cli_script(
    provider: Provider,
    edit: impl FnOnce(&mut Vec<String>),
) -> Result<String, WorkerError> {
    let bare = AgentSpec {
        prompt: String::new(),
        model: None,
        max_turns: None,
        allowed_tools: None,
        provider,
        script: None,
    };
    let mut argv = cli_argv(provider, &bare);
    if argv.is_empty() {
        return Err(WorkerError::Invalid {
            field: "provider".into(),
            message: format!("{provider} has no CLI"),
        });
    }
    edit(&mut argv);
    let command = shlex::try_join(argv.iter().map(String::as_str)).map_err(quote_error)?;
    Ok(format!(
        "#!/bin/sh\n\
         # Written by the Squadron worker: provider {provider}, headless.\n\
         {prelude}\
         exec {command}\n",
        prelude = provider_prelude(provider),
    ))
}

/// Sandbox paths `launch.sh` wires together.
struct LaunchPaths<'a> {
    prompt: String,
    egress_env: String,
    stdout: String,
    stderr: String,
    workdir: &'a str,
}

fn launch_script(
    dir: &TaskDir,
    attempt: u32,
    probes: &[ProbeSpec],
    provider: Provider,
    argv: &[String],
    paths: &LaunchPaths<'_>,
) -> Result<String, WorkerError> {
    let command = shlex::try_join(argv.iter().map(String::as_str)).map_err(quote_error)?;
    let key = format!(
        "{}{}",
        readiness_prelude(probes)?,
        provider_prelude(provider)
    );
    Ok(format!(
        "#!/bin/sh\n\
         # Written by the Squadron worker: task {task}, attempt {attempt}, provider {provider}.\n\
         # The prompt reaches the provider on standard input; it is never an argument.\n\
         # Output is appended to the task's progress logs; exec hands signals to the provider.\n\
         exec <{prompt} >>{stdout} 2>>{stderr}\n\
         cd {workdir} || exit {LAUNCH_WORKDIR_EXIT_CODE}\n\
         if [ -r {egress_env} ]; then . {egress_env} || exit 1; fi\n\
         {key}\
         exec {command}\n",
        task = dir.task(),
        prompt = quote(&paths.prompt)?,
        egress_env = quote(&paths.egress_env)?,
        stdout = quote(&paths.stdout)?,
        stderr = quote(&paths.stderr)?,
        workdir = quote(paths.workdir)?,
    ))
}

/// One word for `sh`, exactly as given (`shlex`).
fn quote(word: &str) -> Result<String, WorkerError> {
    shlex::try_quote(word)
        .map(|q| q.into_owned())
        .map_err(quote_error)
}

/// A word `sh` cannot be handed: only a NUL byte is.
fn quote_error(e: shlex::QuoteError) -> WorkerError {
    WorkerError::Invalid {
        field: "agent".into(),
        message: format!("a word of the provider's command line cannot be quoted: {e}"),
    }
}

/// An absolute sandbox path that `sh` can be handed: no control characters (NUL and newline
/// included), no `..`, bounded.
fn check_path(field: &str, path: &str) -> Result<(), WorkerError> {
    let invalid = |message: String| WorkerError::Invalid {
        field: field.to_string(),
        message,
    };
    if path.len() > LAUNCH_WORKDIR_BYTES_MAX {
        return Err(invalid(format!(
            "must be at most {LAUNCH_WORKDIR_BYTES_MAX} bytes"
        )));
    }
    if !path.starts_with('/') {
        return Err(invalid(format!("must be an absolute path, got {path:?}")));
    }
    if path.chars().any(char::is_control) {
        return Err(invalid("must not contain control characters".into()));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(invalid(format!("must not contain '..', got {path:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::process::Command;

    use super::*;
    use crate::task::task_dir::{INBOX_MOUNT, OUTBOX_MOUNT, RUN_MOUNT};
    use crate::test_support::{spec_for, task_dir, write};

    const NASTY_PROMPT: &str = "Fix it; rm -rf / && echo $HOME $(id) `whoami` 'single' \"double\"\n\
                                second line \\ with backslash | cat > /tmp/x < /dev/null & ${PATH}\n";

    fn claude_spec() -> TaskSpec {
        let mut spec = spec_for("/srv/repo");
        spec.agent.provider = Provider::Claude;
        spec.agent.script = None;
        spec
    }

    fn launch_text(dir: &TaskDir) -> String {
        std::fs::read_to_string(dir.run().join(LAUNCH_SCRIPT_NAME)).unwrap()
    }

    fn last_line(text: &str) -> &str {
        text.lines().last().unwrap()
    }

    #[test]
    fn mount_paths_agree_with_the_task_dir() {
        assert_eq!(RUN_MOUNT, format!("{SANDBOX_MOUNT_PREFIX}/run"));
        assert_eq!(INBOX_MOUNT, format!("{SANDBOX_MOUNT_PREFIX}/inbox"));
        assert_eq!(OUTBOX_MOUNT, format!("{SANDBOX_MOUNT_PREFIX}/outbox"));
    }

    #[test]
    fn an_agent_profile_s_cli_script_moves_the_key_and_execs_the_headless_cli() {
        let claude = cli_script(Provider::Claude, |_| {}).unwrap();
        assert!(claude.contains("ANTHROPIC_API_KEY=$(cat \"${ANTHROPIC_API_KEY_FILE}\")"));
        assert_eq!(
            last_line(&claude),
            "exec claude --print --output-format stream-json --verbose --permission-mode \
             bypassPermissions"
        );
        let codex = cli_script(Provider::Codex, |_| {}).unwrap();
        assert!(codex.contains("model_provider = \"squadron\""), "{codex}");
        assert_eq!(
            last_line(&codex),
            "exec codex exec --json --sandbox danger-full-access --skip-git-repo-check -"
        );
        for text in [&claude, &codex] {
            let syntax = Command::new("sh")
                .args(["-n", "-c", text])
                .status()
                .unwrap();
            assert!(syntax.success(), "{text}");
        }
        assert!(cli_script(Provider::Script, |_| {}).is_err());
    }

    #[test]
    fn claude_command_line_follows_the_spec() {
        let (_tmp, dir) = task_dir(7);
        let mut spec = claude_spec();
        let plan = prepare_launch(&dir, 2, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
        assert_eq!(plan.argv, ["/bin/sh", "/mnt/run/launch.sh"]);
        assert_eq!(plan.workdir, "/mnt/inbox");
        assert_eq!(plan.provider, Provider::Claude);
        assert_eq!(
            plan.provider_argv,
            [
                "claude",
                "--print",
                "--output-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "bypassPermissions"
            ]
        );
        let text = launch_text(&dir);
        assert!(text.starts_with("#!/bin/sh\n"), "{text}");
        assert!(text.contains(
            "exec </mnt/run/prompt.txt >>/mnt/outbox/progress/stdout.log 2>>/mnt/outbox/progress/stderr.log\n"
        ));
        assert!(text.contains("cd /mnt/inbox || exit 126\n"), "{text}");
        assert_eq!(
            last_line(&text),
            "exec claude --print --output-format stream-json --verbose --permission-mode \
             bypassPermissions"
        );
        assert!(
            text.contains("if [ -n \"${ANTHROPIC_API_KEY_FILE:-}\" ]; then ANTHROPIC_API_KEY=$(cat \"${ANTHROPIC_API_KEY_FILE}\") || exit 1; export ANTHROPIC_API_KEY; fi\n"),
            "{text}"
        );
        assert_eq!(plan.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"], "1");
        assert!(
            text.contains("task 7, attempt 2, provider claude"),
            "{text}"
        );
        assert!(!dir.run().join(SCRIPT_FILE_NAME).exists());

        spec.agent.model = Some("claude-sonnet-4-5-20250929".into());
        spec.agent.max_turns = Some(100);
        spec.agent.allowed_tools = Some(vec!["Read".into(), "Bash(git:*)".into(), "Edit".into()]);
        let plan = prepare_launch(
            &dir,
            2,
            &spec,
            "/mnt/inbox/packages/a b",
            &EnvAllowlist::default(),
        )
        .unwrap();
        assert_eq!(
            plan.provider_argv,
            [
                "claude",
                "--print",
                "--output-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "bypassPermissions",
                "--model",
                "claude-sonnet-4-5-20250929",
                "--max-turns",
                "100",
                "--allowedTools",
                "Read,Bash(git:*),Edit",
            ]
        );
        let text = launch_text(&dir);
        assert_eq!(
            last_line(&text),
            "exec claude --print --output-format stream-json --verbose --permission-mode \
             bypassPermissions --model claude-sonnet-4-5-20250929 --max-turns 100 --allowedTools 'Read,Bash(git:*),Edit'"
        );
        assert!(
            text.contains("cd '/mnt/inbox/packages/a b' || exit 126\n"),
            "{text}"
        );

        spec.agent.allowed_tools = Some(vec![]);
        prepare_launch(&dir, 2, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
        assert!(!launch_text(&dir).contains("--allowedTools"));
    }

    /// The pinned CLIs (providers/versions.env, installed by scripts/test) accept every flag
    /// the launcher gives them: each is run with its whole command line and no prompt, and
    /// must get past its argument parser to its "no input" refusal.
    #[test]
    fn the_pinned_clis_accept_every_flag_the_launcher_uses() {
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        // As a sandbox runs them: never as root (Claude Code refuses its permission mode there).
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let unprivileged: &[&str] = if root {
            &[
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--",
            ]
        } else {
            &[]
        };
        let mut spec = claude_spec();
        spec.agent.model = Some("scripted-model".into());
        spec.agent.max_turns = Some(3);
        spec.agent.allowed_tools = Some(vec!["Read".into(), "Write".into()]);
        // An agent profile's next generation of the same CLI adds the words that resume its
        // session (agent/native_session.rs): a session that does not exist gets past the parser
        // to the CLI's own "not found".
        let session = "0199a213-81c0-7800-8aa1-bbab2a035a53";
        // A generation granted MCP servers gets its CLI's MCP words (agent/mcp_access.rs);
        // Claude Code reads the configuration file, here a copy in the test's home.
        let mcp = crate::agent::mcp_access::McpAccess::new(vec!["notes".parse().unwrap()]);
        let config = home.path().join("mcp.json");
        let (_, text) = mcp.run_files().into_iter().nth(1).unwrap();
        std::fs::write(&config, text).unwrap();
        for (provider, resume, with_mcp, parsed) in [
            (Provider::Claude, false, false, "Input must be provided"),
            (Provider::Codex, false, false, "No prompt provided"),
            (Provider::Claude, true, false, "No conversation found"),
            (Provider::Codex, true, false, "No prompt provided"),
            (Provider::Claude, false, true, "Input must be provided"),
            (Provider::Codex, true, true, "No prompt provided"),
        ] {
            spec.agent.provider = provider;
            let mut argv = provider_argv(&spec.agent, "/mnt/run");
            if with_mcp {
                mcp.insert_into(provider, &mut argv);
                for word in &mut argv {
                    if word == "/mnt/run/mcp.json" {
                        *word = config.display().to_string();
                    }
                }
            }
            if resume {
                crate::agent::native_session::NativeSession {
                    provider,
                    id: session.into(),
                }
                .insert_into(&mut argv);
            }
            let command: Vec<&str> = unprivileged
                .iter()
                .copied()
                .chain(argv.iter().map(String::as_str))
                .collect();
            let out = Command::new(command[0])
                .args(&command[1..])
                .current_dir(home.path())
                .env("HOME", home.path())
                .env("CODEX_HOME", home.path())
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap_or_else(|e| {
                    panic!(
                        "{} is not installed (scripts/test installs it): {e}",
                        argv[0]
                    )
                });
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(said.contains(parsed), "{argv:?} said: {said}");
        }
    }

    #[test]
    fn codex_and_script_command_lines() {
        let (_tmp, dir) = task_dir(8);
        let mut spec = claude_spec();
        spec.agent.provider = Provider::Codex;
        spec.agent.max_turns = Some(5);
        spec.agent.allowed_tools = Some(vec!["Read".into()]);
        let plan = prepare_launch(&dir, 1, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
        assert_eq!(
            plan.provider_argv,
            [
                "codex",
                "exec",
                "--json",
                "--sandbox",
                "danger-full-access",
                "--skip-git-repo-check",
                "-"
            ]
        );
        spec.agent.model = Some("gpt-5-codex".into());
        prepare_launch(&dir, 1, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
        assert_eq!(
            last_line(&launch_text(&dir)),
            "exec codex exec --json --model gpt-5-codex --sandbox danger-full-access \
             --skip-git-repo-check -"
        );

        let spec = spec_for("/srv/repo");
        let plan = prepare_launch(&dir, 1, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
        assert_eq!(plan.provider_argv, ["/bin/sh", "/mnt/run/script.sh"]);
        assert_eq!(
            last_line(&launch_text(&dir)),
            "exec /bin/sh /mnt/run/script.sh"
        );
        assert_eq!(
            std::fs::read_to_string(dir.run().join(SCRIPT_FILE_NAME)).unwrap(),
            "cat"
        );
    }

    #[test]
    fn the_prompt_is_only_in_prompt_txt() {
        let (_tmp, dir) = task_dir(9);
        for provider in Provider::ALL {
            let mut spec = spec_for("/srv/repo");
            spec.agent.prompt = NASTY_PROMPT.into();
            if provider != Provider::Script {
                spec.agent.provider = provider;
                spec.agent.script = None;
            }
            let plan =
                prepare_launch(&dir, 1, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
            assert_eq!(
                std::fs::read_to_string(dir.run().join(PROMPT_FILE_NAME)).unwrap(),
                NASTY_PROMPT
            );
            let text = launch_text(&dir);
            for fragment in ["Fix it", "whoami", "second line", "rm -rf"] {
                assert!(!text.contains(fragment), "{provider}: {text}");
                assert!(plan
                    .argv
                    .iter()
                    .chain(&plan.provider_argv)
                    .all(|a| !a.contains(fragment)));
            }
        }
    }

    #[test]
    fn the_environment_is_the_base_plus_the_allowlist() {
        let (_tmp, dir) = task_dir(10);
        let spec = spec_for("/srv/repo");
        // A name no other test or process uses.
        std::env::set_var("SQUADRON_LAUNCHER_TEST_KEY", "sk-test-value");
        let allow =
            EnvAllowlist::new(["SQUADRON_LAUNCHER_TEST_KEY", "SQUADRON_LAUNCHER_TEST_UNSET"])
                .unwrap();
        let plan = prepare_launch(&dir, 3, &spec, "/mnt/inbox", &allow).unwrap();
        let expected: BTreeMap<String, String> = [
            ("HOME", SANDBOX_HOME),
            ("LANG", SANDBOX_LANG),
            ("PATH", SANDBOX_PATH),
            ("SQUADRON_ATTEMPT", "3"),
            ("SQUADRON_LAUNCHER_TEST_KEY", "sk-test-value"),
            ("SQUADRON_TASK_ID", "10"),
            ("TERM", SANDBOX_TERM),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(plan.env, expected);
        // Values stay in memory: never written to the run directory.
        for entry in std::fs::read_dir(dir.run()).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(!text.contains("sk-test-value"));
        }
        let plan = prepare_launch(&dir, 3, &spec, "/mnt/inbox", &EnvAllowlist::default()).unwrap();
        assert!(!plan.env.contains_key("SQUADRON_LAUNCHER_TEST_KEY"));
    }

    #[test]
    fn bad_workdirs_are_refused() {
        let (_tmp, dir) = task_dir(11);
        let spec = spec_for("/srv/repo");
        for (workdir, why) in [
            ("mnt/inbox", "absolute"),
            ("/mnt/inbox/../run", "'..'"),
            ("/mnt/inbox/a\nb", "control"),
            ("/mnt/inboxes", "not inside /mnt/inbox"),
            ("/etc", "not inside /mnt/inbox"),
        ] {
            let err = prepare_launch(&dir, 1, &spec, workdir, &EnvAllowlist::default())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("workdir") && err.contains(why),
                "{workdir:?}: {err}"
            );
        }
        let mut bad = spec.clone();
        bad.agent.script = None;
        let err =
            prepare_launch(&dir, 1, &bad, "/mnt/inbox", &EnvAllowlist::default()).unwrap_err();
        assert!(err.to_string().contains("agent.script"), "{err}");
    }

    /// Runs `launch.sh` with `/bin/sh` on the host, the task directory standing in for `/mnt`.
    fn run_on_host(dir: &TaskDir, plan: &LaunchPlan, extra_path: Option<&Path>) -> i32 {
        let mut env = plan.env.clone();
        if let Some(extra) = extra_path {
            env.insert("PATH".into(), format!("{}:{SANDBOX_PATH}", extra.display()));
        }
        let status = Command::new(&plan.argv[0])
            .arg(&plan.argv[1])
            .env_clear()
            .envs(&env)
            .current_dir(dir.root())
            .status()
            .unwrap();
        status.code().unwrap()
    }

    /// The plan of attempt 1 with the task directory itself as the mount prefix, working in
    /// `inbox` (the tests that run `launch.sh` on the host).
    fn host_plan(dir: &TaskDir, spec: &TaskSpec, inbox_dir: &str) -> LaunchPlan {
        let prefix = dir.root().to_str().unwrap().to_string();
        let workdir = format!("{prefix}{inbox_dir}");
        prepare_launch_with_mounts(dir, 1, spec, &workdir, &EnvAllowlist::default(), &prefix)
            .unwrap()
    }

    fn host_layout(dir: &TaskDir) -> String {
        for path in [dir.run(), dir.inbox().join("sub dir"), dir.progress()] {
            std::fs::create_dir_all(path).unwrap();
        }
        dir.root().to_str().unwrap().to_string()
    }

    #[test]
    fn launch_sh_wires_stdin_stdout_stderr_and_the_exit_code() {
        let (_tmp, dir) = task_dir(12);
        let prefix = host_layout(&dir);
        let mut spec = spec_for("/srv/repo");
        spec.agent.prompt = NASTY_PROMPT.into();
        spec.agent.script = Some(
            "printf 'cwd=%s\\n' \"$(pwd)\"\ncat\necho \"task=$SQUADRON_TASK_ID attempt=$SQUADRON_ATTEMPT\"\n\
             echo to-stderr >&2\nexit 3\n"
                .into(),
        );
        let workdir = format!("{prefix}/inbox/sub dir");
        let plan =
            prepare_launch_with_mounts(&dir, 4, &spec, &workdir, &EnvAllowlist::default(), &prefix)
                .unwrap();
        assert_eq!(
            plan.argv,
            ["/bin/sh".to_string(), format!("{prefix}/run/launch.sh")]
        );
        assert_eq!(run_on_host(&dir, &plan, None), 3);
        let expected = format!("cwd={workdir}\n{NASTY_PROMPT}task=12 attempt=4\n");
        assert_eq!(std::fs::read_to_string(dir.stdout_log()).unwrap(), expected);
        assert_eq!(
            std::fs::read_to_string(dir.stderr_log()).unwrap(),
            "to-stderr\n"
        );

        // Appends: a second run keeps the first's output.
        assert_eq!(run_on_host(&dir, &plan, None), 3);
        assert_eq!(
            std::fs::read_to_string(dir.stdout_log()).unwrap(),
            format!("{expected}{expected}")
        );
    }

    #[test]
    fn launch_sh_execs_the_provider_with_its_arguments() {
        let (_tmp, dir) = task_dir(13);
        host_layout(&dir);
        let bin = dir.root().join("fake-bin");
        // A stand-in `claude` that prints its arguments and its stdin, and its pid relation.
        write(
            &bin.join("claude"),
            "#!/bin/sh\nfor a in \"$@\"; do printf '<%s>\\n' \"$a\"; done\ncat\n",
        );
        std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let mut spec = claude_spec();
        spec.agent.prompt = NASTY_PROMPT.into();
        spec.agent.model = Some("m-1".into());
        spec.agent.allowed_tools = Some(vec!["Read".into(), "Bash(ls:*)".into()]);
        let plan = host_plan(&dir, &spec, "/inbox");
        assert_eq!(run_on_host(&dir, &plan, Some(&bin)), 0);
        assert_eq!(
            std::fs::read_to_string(dir.stdout_log()).unwrap(),
            format!(
                "<--print>\n<--output-format>\n<stream-json>\n<--verbose>\n<--permission-mode>\n\
                 <bypassPermissions>\n<--model>\n<m-1>\n<--allowedTools>\n<Read,Bash(ls:*)>\n\
                 {NASTY_PROMPT}"
            )
        );
    }

    /// Each CLI finds its key in its environment, moved from the credential file the lease
    /// wrote, and Codex finds the worker's base URL as its model provider; the key is in no
    /// file `launch.sh` wrote.
    #[test]
    fn launch_sh_moves_the_key_into_the_cli_environment_and_configures_codex() {
        const KEY: &str = "sk-test-moved-key";
        for (provider, file_var, key_var) in [
            (
                Provider::Claude,
                "ANTHROPIC_API_KEY_FILE",
                "ANTHROPIC_API_KEY",
            ),
            (Provider::Codex, "OPENAI_API_KEY_FILE", "CODEX_API_KEY"),
        ] {
            let (_tmp, dir) = task_dir(15);
            host_layout(&dir);
            let bin = dir.root().join("fake-bin");
            let home = dir.root().join("home");
            std::fs::create_dir_all(&home).unwrap();
            let cli = provider.to_string();
            write(
                &bin.join(&cli),
                format!(
                    "#!/bin/sh\necho \"key=${key_var}\"\ncat \"$HOME/.codex/config.toml\" 2>/dev/null || true\n"
                ),
            );
            std::fs::set_permissions(bin.join(&cli), std::fs::Permissions::from_mode(0o755))
                .unwrap();
            let key_file = dir.root().join("key");
            write(&key_file, KEY);
            let mut spec = claude_spec();
            spec.agent.provider = provider;
            let mut plan = host_plan(&dir, &spec, "/inbox");
            plan.env
                .insert(file_var.into(), key_file.display().to_string());
            plan.env.insert("HOME".into(), home.display().to_string());
            plan.env
                .insert("OPENAI_BASE_URL".into(), "http://model.test/v1".into());
            assert_eq!(run_on_host(&dir, &plan, Some(&bin)), 0, "{provider}");
            let out = std::fs::read_to_string(dir.stdout_log()).unwrap();
            assert!(
                out.starts_with(&format!("key={KEY}\n")),
                "{provider}: {out}"
            );
            if provider == Provider::Codex {
                assert!(
                    out.contains("model_provider = \"squadron\"")
                        && out.contains("base_url = \"http://model.test/v1\""),
                    "{out}"
                );
            }
            assert!(!launch_text(&dir).contains(KEY));
        }
    }

    /// `egress.env`, written when an egress-injected credential is leased, is read before the
    /// probes and the provider: its variables reach the provider and its `{MOUNT}_FILE` is
    /// gone. Writing `launch.sh` again leaves it be.
    #[test]
    fn launch_sh_reads_the_egress_environment_before_the_probes_and_the_provider() {
        let (_tmp, dir) = task_dir(17);
        host_layout(&dir);
        let egress_env = dir.run().join(EGRESS_ENV_FILE_NAME);
        let mut spec = spec_for("/srv/repo");
        spec.agent.script =
            Some("echo \"file=${ANTHROPIC_API_KEY_FILE:-none} url=$ANTHROPIC_BASE_URL\"\n".into());
        let mut plan = host_plan(&dir, &spec, "/inbox");
        assert!(
            !egress_env.exists(),
            "an earlier attempt's file outlived launch.sh's writing"
        );
        plan.env
            .insert("ANTHROPIC_API_KEY_FILE".into(), "/nowhere".into());
        write(
            &egress_env,
            "unset ANTHROPIC_API_KEY_FILE\nexport ANTHROPIC_BASE_URL='http://127.0.0.1:4180/a'\n",
        );
        assert_eq!(run_on_host(&dir, &plan, None), 0);
        let out = std::fs::read_to_string(dir.stdout_log()).unwrap();
        assert_eq!(out, "file=none url=http://127.0.0.1:4180/a\n");
        // A file the shell cannot read through fails the launch rather than running without.
        write(&egress_env, "exit_not_a_command() {\n");
        assert_ne!(run_on_host(&dir, &plan, None), 0);
    }

    /// The readiness probes run before the provider: the first that fails stops `launch.sh`
    /// with its line on stderr and exit 125, and the provider never starts; once every probe
    /// holds, the provider runs.
    #[test]
    fn readiness_probes_gate_the_provider() {
        let (_tmp, dir) = task_dir(16);
        host_layout(&dir);
        let text =
            "version: \"1\"\nkind: Task\nmetadata:\n  name: probes\nrepository:\n  url: /srv/r\n\
                    agent:\n  prompt: p\n  provider: script\n  script: echo provider ran\n\
                    startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
                    session: { launcher: x, workdir: /workspace, cols: 80, rows: 24 }\n  \
                    readiness:\n    probes:\n      - { provider: claude, kind: auth }\n      \
                    - { provider: github, kind: repo_access }\n  \
                    observation: { retention_class: short, redaction_profile: credentials }\n";
        let spec = squadron_core::manifest::parse_manifest_yaml(text).unwrap();
        let mut plan = host_plan(&dir, &spec, "/inbox");
        let run = |plan: &LaunchPlan| {
            std::fs::write(dir.stdout_log(), b"").unwrap();
            std::fs::write(dir.stderr_log(), b"").unwrap();
            let code = run_on_host(&dir, plan, None);
            let out = std::fs::read_to_string(dir.stdout_log()).unwrap();
            let err = std::fs::read_to_string(dir.stderr_log()).unwrap();
            (code, out, err)
        };
        let (code, out, err) = run(&plan);
        assert_eq!(code, READINESS_EXIT_CODE);
        assert!(out.is_empty(), "the provider ran: {out}");
        assert_eq!(
            err,
            "squadron: readiness probe claude/auth failed: no anthropic_api_key credential in \
             the sandbox (startup_profile.credential_refs)\n"
        );
        let key = dir.root().join("key");
        write(&key, "k");
        plan.env
            .insert("ANTHROPIC_API_KEY_FILE".into(), key.display().to_string());
        let (code, _, err) = run(&plan);
        assert_eq!(code, READINESS_EXIT_CODE);
        assert!(err.contains("github/repo_access failed"), "{err}");
        plan.env
            .insert("GITHUB_TOKEN_FILE".into(), key.display().to_string());
        let (code, out, _) = run(&plan);
        assert_eq!((code, out.as_str()), (0, "provider ran\n"));
    }

    #[test]
    fn launch_sh_fails_clearly_without_its_workdir_or_provider() {
        let (_tmp, dir) = task_dir(14);
        host_layout(&dir);
        let spec = spec_for("/srv/repo");
        let plan = host_plan(&dir, &spec, "/inbox/missing");
        assert_eq!(run_on_host(&dir, &plan, None), LAUNCH_WORKDIR_EXIT_CODE);
        let stderr = std::fs::read_to_string(dir.stderr_log()).unwrap();
        assert!(stderr.contains("missing"), "{stderr}");

        let mut spec = claude_spec();
        spec.agent.provider = Provider::Codex;
        let plan = host_plan(&dir, &spec, "/inbox");
        // No `codex` on the sandbox PATH of this host.
        let empty = dir.root().join("empty-bin");
        std::fs::create_dir_all(&empty).unwrap();
        let mut env = plan.env.clone();
        env.insert("PATH".into(), empty.display().to_string());
        let status = Command::new("/bin/sh")
            .arg(&plan.argv[1])
            .env_clear()
            .envs(&env)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(127));
        assert!(std::fs::read_to_string(dir.stderr_log())
            .unwrap()
            .contains("codex"));
    }
}
