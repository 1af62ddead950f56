//! What a provider CLI's own structured stream says about its run: Claude Code's
//! `stream-json` and Codex's `exec --json` JSONL, both the task's stdout: the session id and
//! model, each tool call by name, the tokens, the cost where the CLI gives one, the turns and
//! how the run ended (the seed's progress tracking: tool calls, current tool, tokens).
//!
//! While the provider runs, the driver follows the stream ([`ProviderFollower`]): each tool
//! call becomes a `tool_call` event in `events.jsonl` as it happens, and the running summary
//! is what the task's usage shows (`provider`). Once the provider exited, the whole stream's
//! summary is appended as `provider_summary`.
//!
//! Lines that are not JSON, or not an event this reads, are skipped: the stream is the
//! provider's, and a provider may print anything.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;
use squadron_core::provider::Provider;
use squadron_core::task::PROVIDER_NAME_BYTES_MAX;
use squadron_isolation::beneath::Beneath;

/// Most bytes of the stream read; a longer stream is summarized from its start.
pub(crate) const PROVIDER_STREAM_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Longest line parsed; longer ones (a large tool result) are skipped.
pub(crate) const PROVIDER_LINE_BYTES_MAX: usize = 1024 * 1024;
/// Most distinct tool names counted; further names count under `other`.
pub(crate) const PROVIDER_TOOL_NAMES_MAX: usize = 64;
/// Most bytes kept of the provider's last message.
pub(crate) const PROVIDER_TEXT_BYTES_MAX: usize = 4 * 1024;

/// The run as the provider's stream tells it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ProviderSummary {
    pub(crate) session_id: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) tool_calls: u64,
    /// Calls per tool name.
    pub(crate) tools: BTreeMap<String, u64>,
    /// The last tool called.
    pub(crate) last_tool: Option<String>,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cost_usd: Option<f64>,
    pub(crate) turns: u64,
    /// How the CLI said the run ended (`success`, `error_max_turns`, …), where it says.
    pub(crate) result: Option<String>,
    /// The provider's last message to the user, at most [`PROVIDER_TEXT_BYTES_MAX`] bytes.
    pub(crate) last_text: Option<String>,
    /// Lines read and lines that were not JSON.
    pub(crate) lines: u64,
    pub(crate) unparsed_lines: u64,
    /// The tools called since the follower last took them, in order.
    #[serde(skip)]
    called: Vec<String>,
}

impl ProviderSummary {
    fn said(&mut self, text: &str) {
        self.last_text = Some(cut_at(text, PROVIDER_TEXT_BYTES_MAX).to_string());
    }

    fn tool(&mut self, name: &str) {
        let name = cut_at(name, PROVIDER_NAME_BYTES_MAX);
        self.tool_calls += 1;
        let key = if self.tools.len() < PROVIDER_TOOL_NAMES_MAX || self.tools.contains_key(name) {
            name.to_string()
        } else {
            "other".to_string()
        };
        *self.tools.entry(key).or_insert(0) += 1;
        self.last_tool = Some(name.to_string());
        self.called.push(name.to_string());
    }
}

/// The longest start of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn cut_at(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Summarizes the stream of `provider`; `None` for a provider without a structured stream.
pub(crate) fn summarize(provider: Provider, stream: impl Read) -> Option<ProviderSummary> {
    let mut follower = ProviderFollower::new(provider)?;
    let mut stream = stream.take(PROVIDER_STREAM_BYTES_MAX);
    let mut chunk = vec![0u8; FOLLOW_CHUNK_BYTES];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                follower.feed(&chunk[..n]);
            }
        }
    }
    follower.finish();
    Some(follower.summary)
}

/// Bytes read at a time from the stream.
const FOLLOW_CHUNK_BYTES: usize = 64 * 1024;
/// Most bytes of the stream one look of a running provider reads; the rest waits for the
/// next look.
pub(crate) const FOLLOW_READ_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// The stream read as it grows, while the provider runs: each look feeds what was appended
/// since the last one, line by line, to the summary, and says which tools were called in it
/// (the `tool_call` events of `events.jsonl`). A line still being written waits for its end.
#[derive(Debug)]
pub(crate) struct ProviderFollower {
    read_event: fn(&mut ProviderSummary, &Value),
    summary: ProviderSummary,
    /// The start of a line not yet ended.
    partial: Vec<u8>,
    /// Inside a line longer than [`PROVIDER_LINE_BYTES_MAX`], skipped to its end.
    skipping: bool,
    /// Bytes of the stream fed so far: where the next look reads from.
    offset: u64,
    /// The last look left bytes of the stream unread.
    behind: bool,
}

impl ProviderFollower {
    /// `None` for a provider without a structured stream (`script`).
    pub(crate) fn new(provider: Provider) -> Option<Self> {
        let read_event: fn(&mut ProviderSummary, &Value) = match provider {
            Provider::Claude => claude_event,
            Provider::Codex => codex_event,
            Provider::Script => return None,
        };
        Some(ProviderFollower {
            read_event,
            summary: ProviderSummary::default(),
            partial: Vec::new(),
            skipping: false,
            offset: 0,
            behind: false,
        })
    }

    /// Whether the last look left bytes unread (at most [`FOLLOW_READ_BYTES_MAX`] a look).
    pub(crate) fn behind(&self) -> bool {
        self.behind
    }

    pub(crate) fn summary(&self) -> &ProviderSummary {
        &self.summary
    }

    /// Reads what `name` beneath `outbox` gained since the last look (at most
    /// [`FOLLOW_READ_BYTES_MAX`]; no link followed) and feeds it; the tools called in it.
    pub(crate) fn look(&mut self, outbox: &Path, name: &str) -> Vec<String> {
        let opened = Beneath::open(outbox).and_then(|o| o.read(Path::new(name)));
        let Ok(mut file) = opened else {
            return Vec::new();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Replaced or cut by the sandbox: what it holds now is read from its start.
            self.summary = ProviderSummary::default();
            self.partial.clear();
            self.skipping = false;
            self.offset = 0;
        }
        if len <= self.offset || self.offset >= PROVIDER_STREAM_BYTES_MAX {
            self.behind = false;
            return Vec::new();
        }
        let want = (len - self.offset)
            .min(FOLLOW_READ_BYTES_MAX)
            .min(PROVIDER_STREAM_BYTES_MAX - self.offset);
        self.behind = self.offset + want < len.min(PROVIDER_STREAM_BYTES_MAX);
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        match file.take(want).read_to_end(&mut bytes) {
            Ok(_) => self.feed(&bytes),
            Err(_) => Vec::new(),
        }
    }

    /// Feeds bytes that follow what was fed before; the tools called in the lines they end.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.offset += bytes.len() as u64;
        let mut called = Vec::new();
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            let ended = piece.last() == Some(&b'\n');
            if self.skipping || self.partial.len() + piece.len() > PROVIDER_LINE_BYTES_MAX {
                // An over-long line is skipped whole and counted once, at its end.
                self.partial.clear();
                self.skipping = !ended;
                if ended {
                    self.summary.lines += 1;
                    self.summary.unparsed_lines += 1;
                }
                continue;
            }
            self.partial.extend_from_slice(piece);
            if ended {
                let line = std::mem::take(&mut self.partial);
                self.line(&line, &mut called);
            }
        }
        called
    }

    /// The stream ended: a last line without its newline is read too.
    pub(crate) fn finish(&mut self) -> Vec<String> {
        let mut called = Vec::new();
        if self.skipping {
            self.summary.lines += 1;
            self.summary.unparsed_lines += 1;
        } else {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut called);
        }
        self.skipping = false;
        called
    }

    fn line(&mut self, line: &[u8], called: &mut Vec<String>) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.summary.lines += 1;
        match serde_json::from_slice::<Value>(line) {
            Ok(event) => {
                (self.read_event)(&mut self.summary, &event);
                called.append(&mut self.summary.called);
            }
            Err(_) => self.summary.unparsed_lines += 1,
        }
    }
}

/// A string field of an event, cut at [`PROVIDER_NAME_BYTES_MAX`]: ids and names only.
fn text(v: &Value) -> Option<String> {
    v.as_str()
        .map(|s| cut_at(s, PROVIDER_NAME_BYTES_MAX).to_string())
}

/// Claude Code `stream-json`: `system/init` (session, model), `assistant` messages whose
/// content holds `tool_use` blocks, and the closing `result` (usage, cost, turns).
fn claude_event(s: &mut ProviderSummary, e: &Value) {
    match e["type"].as_str() {
        Some("system") if e["subtype"] == "init" => {
            s.session_id = text(&e["session_id"]).or(s.session_id.take());
            s.model = text(&e["model"]).or(s.model.take());
        }
        Some("assistant") => {
            for block in e["message"]["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_use" {
                    s.tool(block["name"].as_str().unwrap_or("unnamed"));
                } else if let Some(said) =
                    block["text"].as_str().filter(|_| block["type"] == "text")
                {
                    s.said(said);
                }
            }
        }
        Some("result") => {
            s.input_tokens = e["usage"]["input_tokens"]
                .as_u64()
                .unwrap_or(s.input_tokens);
            s.output_tokens = e["usage"]["output_tokens"]
                .as_u64()
                .unwrap_or(s.output_tokens);
            s.cost_usd = e["total_cost_usd"].as_f64().or(s.cost_usd);
            s.turns = e["num_turns"].as_u64().unwrap_or(s.turns);
            s.result = text(&e["subtype"]);
        }
        _ => {}
    }
}

/// Codex `exec --json`: `thread.started` (session), completed items that are tool work
/// (commands, file changes, MCP calls, web searches), and each `turn.completed` with its
/// usage; `turn.failed` ends it badly.
fn codex_event(s: &mut ProviderSummary, e: &Value) {
    match e["type"].as_str() {
        Some("thread.started") => s.session_id = text(&e["thread_id"]).or(s.session_id.take()),
        Some("item.completed") => {
            let kind = e["item"]["type"].as_str().unwrap_or_default();
            if matches!(
                kind,
                "command_execution" | "file_change" | "mcp_tool_call" | "web_search"
            ) {
                s.tool(kind);
            } else if let Some(said) = e["item"]["text"]
                .as_str()
                .filter(|_| kind == "agent_message")
            {
                s.said(said);
            }
        }
        Some("turn.completed") => {
            s.turns += 1;
            s.input_tokens += e["usage"]["input_tokens"].as_u64().unwrap_or(0);
            s.output_tokens += e["usage"]["output_tokens"].as_u64().unwrap_or(0);
            s.result = Some("success".into());
        }
        Some("turn.failed") => {
            s.turns += 1;
            s.result = Some("failed".into());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as Claude Code 2.1.332 wrote them in `tests/real_providers.rs` (trimmed).
    const CLAUDE: &str = r#"{"type":"system","subtype":"init","cwd":"/mnt/inbox","session_id":"6ce8cc76","model":"claude-scripted-1","permissionMode":"bypassPermissions"}
{"type":"assistant","message":{"content":[{"id":"toolu_1","input":{"file_path":"/x"},"name":"Read","type":"tool_use"}]}}
{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":"ok","tool_use_id":"toolu_1"}]}}
not json at all
{"type":"assistant","message":{"content":[{"name":"Edit","type":"tool_use"},{"name":"Read","type":"tool_use"}]}}
{"type":"assistant","message":{"content":[{"text":"Done.","type":"text"}]}}
{"type":"result","subtype":"success","num_turns":4,"total_cost_usd":0.0048,"usage":{"input_tokens":600,"output_tokens":120}}
"#;

    /// Lines as Codex 0.171.0 wrote them there.
    const CODEX: &str = r#"{"type":"thread.started","thread_id":"01a236f5"}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"cat TASK.md","exit_code":0}}
{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Done."}}
{"type":"turn.completed","usage":{"input_tokens":200,"cached_input_tokens":0,"output_tokens":40}}
"#;

    #[test]
    fn claude_code_stream_json_is_summarized() {
        let s = summarize(Provider::Claude, CLAUDE.as_bytes()).unwrap();
        assert_eq!(s.session_id.as_deref(), Some("6ce8cc76"));
        assert_eq!(s.model.as_deref(), Some("claude-scripted-1"));
        assert_eq!(s.tool_calls, 3);
        assert_eq!(s.tools["Read"], 2);
        assert_eq!(s.tools["Edit"], 1);
        assert_eq!(s.last_tool.as_deref(), Some("Read"));
        assert_eq!((s.input_tokens, s.output_tokens, s.turns), (600, 120, 4));
        assert_eq!(s.cost_usd, Some(0.0048));
        assert_eq!(s.result.as_deref(), Some("success"));
        assert_eq!(s.last_text.as_deref(), Some("Done."));
        assert_eq!((s.lines, s.unparsed_lines), (7, 1));
    }

    #[test]
    fn codex_jsonl_is_summarized() {
        let s = summarize(Provider::Codex, CODEX.as_bytes()).unwrap();
        assert_eq!(s.session_id.as_deref(), Some("01a236f5"));
        assert_eq!(s.tool_calls, 1);
        assert_eq!(s.tools["command_execution"], 1);
        assert_eq!((s.input_tokens, s.output_tokens, s.turns), (200, 40, 1));
        assert_eq!(s.cost_usd, None);
        assert_eq!(s.result.as_deref(), Some("success"));
        assert_eq!(s.last_text.as_deref(), Some("Done."));
    }

    #[test]
    fn a_script_has_no_summary_and_bad_streams_are_bounded() {
        assert!(summarize(Provider::Script, "x\n".as_bytes()).is_none());
        // An over-long line is skipped whole; what follows it is still read.
        let mut stream = vec![b'x'; PROVIDER_LINE_BYTES_MAX + 10];
        stream.extend_from_slice(b"\n{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n");
        let s = summarize(Provider::Codex, stream.as_slice()).unwrap();
        assert_eq!(s.session_id.as_deref(), Some("t"));
        assert_eq!((s.lines, s.unparsed_lines), (2, 1));
        // Tool names beyond the limit count under `other`.
        let names: String = (0..PROVIDER_TOOL_NAMES_MAX + 5)
            .map(|i| {
                format!(
                    "{{\"type\":\"assistant\",\"message\":{{\"content\":[{{\"type\":\"tool_use\",\"name\":\"t{i}\"}}]}}}}\n"
                )
            })
            .collect();
        let s = summarize(Provider::Claude, names.as_bytes()).unwrap();
        assert_eq!(s.tools.len(), PROVIDER_TOOL_NAMES_MAX + 1);
        assert_eq!(s.tools["other"], 5);
        assert_eq!(s.tool_calls, PROVIDER_TOOL_NAMES_MAX as u64 + 5);
    }
}
