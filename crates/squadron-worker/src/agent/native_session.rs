//! A provider's own session (issue 16, "each provider's native session id is kept for
//! same-provider resume"): the capsule's context reference `{provider}-session:{id}` names
//! the CLI conversation a generation had, and the next generation of the same CLI resumes it
//! (`claude --resume ID`, `codex exec … resume ID -`) instead of starting afresh, so the model
//! sees the whole conversation and not only the capsule.
//!
//! The id comes from the provider's output, which the sandbox writes: it goes on the next
//! command line only when it is a plain token, and only when the CLI's own record of it lies
//! in the profile's state (`$HOME` is `/state`): a resume of a session the CLI cannot find
//! fails instead of starting, while the capsule alone always works.

use std::path::Path;

use squadron_core::provider::Provider;

/// Longest session id taken from a provider's stream (both CLIs use UUIDs).
pub(crate) const SESSION_ID_BYTES_MAX: usize = 64;
/// Most directory entries looked at while searching the CLI's record of a session.
const SESSION_SEARCH_ENTRIES_MAX: usize = 10_000;
/// Deepest directory searched below the CLI's session root (Codex: `YYYY/MM/DD/`).
const SESSION_SEARCH_DEPTH_MAX: usize = 4;

/// A CLI conversation a generation had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NativeSession {
    pub(crate) provider: Provider,
    pub(crate) id: String,
}

impl NativeSession {
    /// The session a capsule's context reference names, if it is a well-formed one.
    pub(crate) fn from_context_ref(context_ref: &str) -> Option<NativeSession> {
        let (provider, id) = context_ref.split_once("-session:")?;
        let provider = match provider {
            "claude" => Provider::Claude,
            "codex" => Provider::Codex,
            _ => return None,
        };
        let plain = !id.is_empty()
            && id.len() <= SESSION_ID_BYTES_MAX
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        plain.then(|| NativeSession {
            provider,
            id: id.to_owned(),
        })
    }

    /// The session to resume when `provider` starts with `context_ref`: the same CLI's, and
    /// recorded in the profile's state directory `state`.
    pub(crate) fn to_resume(
        provider: Provider,
        context_ref: &str,
        state: &Path,
    ) -> Option<NativeSession> {
        let session = NativeSession::from_context_ref(context_ref)?;
        (session.provider == provider && session.is_recorded_in(state)).then_some(session)
    }

    /// Whether the CLI's record of this session lies below `state` (the sandbox's `$HOME`):
    /// Claude Code's `.claude/projects/{cwd}/{id}.jsonl`, Codex's
    /// `.codex/sessions/YYYY/MM/DD/rollout-{time}-{id}.jsonl`. Links are not followed, the
    /// two directories leading there included: the state directory is the provider's, and a
    /// link there would have root walk the host.
    pub(crate) fn is_recorded_in(&self, state: &Path) -> bool {
        let (home, sessions) = match self.provider {
            Provider::Claude => (".claude", "projects"),
            Provider::Codex => (".codex", "sessions"),
            Provider::Script => return false,
        };
        let plain_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        let root = state.join(home).join(sessions);
        if !plain_dir(&state.join(home)) || !plain_dir(&root) {
            return false;
        }
        let exact = format!("{}.jsonl", self.id);
        let suffix = format!("-{}.jsonl", self.id);
        walkdir::WalkDir::new(root)
            .follow_links(false)
            .follow_root_links(false)
            .max_depth(SESSION_SEARCH_DEPTH_MAX)
            .into_iter()
            .take(SESSION_SEARCH_ENTRIES_MAX)
            .filter_map(Result::ok)
            .any(|e| {
                let name = e.file_name().to_string_lossy();
                e.file_type().is_file() && (name == exact || name.ends_with(&suffix))
            })
    }

    /// The words that resume it, placed where the CLI takes them: Claude Code's flag goes
    /// anywhere, Codex's `resume` subcommand comes after `exec`'s own flags and before the
    /// `-` that reads the prompt from stdin.
    pub(crate) fn insert_into(&self, argv: &mut Vec<String>) {
        match self.provider {
            Provider::Claude => argv.extend(["--resume".to_owned(), self.id.clone()]),
            Provider::Codex => {
                let at = argv.iter().rposition(|a| a == "-").unwrap_or(argv.len());
                argv.splice(at..at, ["resume".to_owned(), self.id.clone()]);
            }
            Provider::Script => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    const ID: &str = "0199a213-81c0-7800-8aa1-bbab2a035a53";

    #[test]
    fn only_a_plain_session_of_a_known_cli_is_taken() {
        let s = NativeSession::from_context_ref(&format!("codex-session:{ID}")).unwrap();
        assert_eq!((s.provider, s.id.as_str()), (Provider::Codex, ID));
        for bad in [
            "",
            "ctx://1",
            "claude-session:",
            "script-session:abc",
            "claude-session:a b",
            "claude-session:$(reboot)",
            "claude-session:../../etc",
            &format!("claude-session:{}", "a".repeat(SESSION_ID_BYTES_MAX + 1)),
        ] {
            assert_eq!(NativeSession::from_context_ref(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_session_is_resumed_only_by_its_own_cli_and_only_when_recorded() {
        let state = tempfile::tempdir().unwrap();
        let claude_ref = format!("claude-session:{ID}");
        let codex_ref = format!("codex-session:{ID}");
        assert_eq!(
            NativeSession::to_resume(Provider::Claude, &claude_ref, state.path()),
            None,
            "nothing recorded yet"
        );
        let project = state.path().join(".claude/projects/-workspace");
        fs::create_dir_all(&project).unwrap();
        fs::write(project.join(format!("{ID}.jsonl")), "{}\n").unwrap();
        let day = state.path().join(".codex/sessions/2026/12/03");
        fs::create_dir_all(&day).unwrap();
        fs::write(
            day.join(format!("rollout-2026-12-03T18-00-00-{ID}.jsonl")),
            "{}\n",
        )
        .unwrap();
        assert!(NativeSession::to_resume(Provider::Claude, &claude_ref, state.path()).is_some());
        assert!(NativeSession::to_resume(Provider::Codex, &codex_ref, state.path()).is_some());
        // A swap never resumes the other CLI's conversation.
        assert_eq!(
            NativeSession::to_resume(Provider::Codex, &claude_ref, state.path()),
            None
        );
        // A link planted where the record should be is not a record.
        let other = format!("claude-session:{}", ID.replace('0', "1"));
        let target = state.path().join("elsewhere.jsonl");
        fs::write(&target, "{}\n").unwrap();
        std::os::unix::fs::symlink(
            &target,
            project.join(format!("{}.jsonl", ID.replace('0', "1"))),
        )
        .unwrap();
        assert_eq!(
            NativeSession::to_resume(Provider::Claude, &other, state.path()),
            None
        );
        // Nor is one behind a linked directory: root never walks where the link points.
        let host = tempfile::tempdir().unwrap();
        let linked = host.path().join("projects/-workspace");
        fs::create_dir_all(&linked).unwrap();
        fs::write(linked.join(format!("{ID}.jsonl")), "{}\n").unwrap();
        fs::remove_dir_all(state.path().join(".claude")).unwrap();
        std::os::unix::fs::symlink(host.path(), state.path().join(".claude")).unwrap();
        assert_eq!(
            NativeSession::to_resume(Provider::Claude, &claude_ref, state.path()),
            None
        );
    }

    #[test]
    fn resume_words_go_where_each_cli_takes_them() {
        let words = |p: Provider, argv: &[&str]| {
            let mut argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            NativeSession {
                provider: p,
                id: ID.into(),
            }
            .insert_into(&mut argv);
            argv.join(" ")
        };
        assert_eq!(
            words(Provider::Claude, &["claude", "--print"]),
            format!("claude --print --resume {ID}")
        );
        assert_eq!(
            words(Provider::Codex, &["codex", "exec", "--json", "-"]),
            format!("codex exec --json resume {ID} -")
        );
    }
}
