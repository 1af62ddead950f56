//! The glob patterns of `lifecycle.artifact_patterns`, matched against `/`-separated paths
//! relative to the task's working directory.
//!
//! Syntax, per `/`-separated segment:
//! - `*` matches any run of characters within one segment (leading dots included);
//! - `?` matches one character;
//! - `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]` match one character of (or not of) a class; a `]`
//!   right after the opening bracket (or its `!`/`^`) is literal, and a `[` without a closing
//!   `]` is a literal `[`;
//! - `\x` matches `x` literally;
//! - a segment that is exactly `**` matches any number of directories, zero included
//!   (`**/*.log` matches `a.log` and `x/y/a.log`); as the last segment it matches everything
//!   below (`coverage/**` matches `coverage/a` and `coverage/x/y`, not `coverage` itself).
//!
//! Patterns are anchored at the working directory like shell globs, not floating like
//! `.gitignore` lines: `*.txt` matches `notes.txt` only, `**/*.txt` matches at any depth.
//!
//! A pattern is parsed here and compiled to a `regex` (whose matching is linear in the
//! path, whatever the number of `**` and `*`); the matcher itself is the crate's. Not
//! `globset`, though it does the same compilation: it matches bytes, so its `?` and classes
//! would match one byte of a multi-byte character (`?.md` would not match `é.md`), and it
//! reads `{a,b}`, an unclosed `[` and a trailing `\` differently from the syntax above.

use regex::{Regex, RegexBuilder};

use crate::error::WorkerError;

/// Longest pattern accepted, in bytes; the manifest allows fewer.
pub(crate) const ARTIFACT_PATTERN_BYTES_MAX: usize = 1_024;
/// Deepest path matched, in segments; deeper paths never match.
pub(crate) const ARTIFACT_PATH_SEGMENTS_MAX: usize = 256;
/// Largest compiled form of one pattern; a pattern within the byte bound stays far below.
pub(crate) const ARTIFACT_PATTERN_REGEX_BYTES_MAX: usize = 8 << 20;

/// One compiled artifact pattern.
#[derive(Debug, Clone)]
pub(crate) struct ArtifactPattern {
    regex: Regex,
    #[cfg(test)]
    segments: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `**`: zero or more whole segments.
    AnyDirs,
    Glob(Vec<Token>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyChar,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// The token as a regular expression over one path segment (never matching `/`).
    fn push_regex(&self, out: &mut String) {
        match self {
            Token::Literal(c) => out.push_str(&regex::escape(&c.to_string())),
            Token::AnyChar => out.push_str("[^/]"),
            Token::Star => out.push_str("[^/]*"),
            Token::Class { negated, ranges } => {
                let valid: Vec<_> = ranges.iter().filter(|(lo, hi)| lo <= hi).collect();
                match (negated, valid.is_empty()) {
                    // A class of nothing: its segment never matches.
                    (false, true) => out.push_str(r"[^\x{0}-\x{10FFFF}]"),
                    (true, true) => out.push_str("[^/]"),
                    (negated, false) => {
                        out.push_str(if *negated { "[^/" } else { "[" });
                        for (lo, hi) in valid {
                            out.push_str(&format!(
                                r"\x{{{:x}}}-\x{{{:x}}}",
                                *lo as u32, *hi as u32
                            ));
                        }
                        out.push(']');
                    }
                }
            }
        }
    }
}

impl ArtifactPattern {
    /// Compiles `text`. `field` names the pattern in errors (`lifecycle.artifact_patterns[2]`).
    pub(crate) fn parse(field: &str, text: &str) -> Result<Self, WorkerError> {
        let invalid = |message: String| WorkerError::Invalid {
            field: field.to_string(),
            message,
        };
        if text.is_empty() {
            return Err(invalid("must not be empty".into()));
        }
        if text.len() > ARTIFACT_PATTERN_BYTES_MAX {
            return Err(invalid(format!(
                "must be at most {ARTIFACT_PATTERN_BYTES_MAX} bytes, got {}",
                text.len()
            )));
        }
        if text.starts_with('/') {
            return Err(invalid(format!(
                "must be relative to the working directory, got {text:?}"
            )));
        }
        if text.chars().any(char::is_control) {
            return Err(invalid("must not contain control characters".into()));
        }
        let mut segments: Vec<Segment> = Vec::new();
        for part in text.split('/') {
            if part.is_empty() || part == "." {
                continue;
            }
            if part == ".." {
                return Err(invalid(format!(
                    "must not contain a '..' segment, got {text:?}"
                )));
            }
            if part == "**" {
                // `**/**` means no more than `**`; collapsing keeps the program small.
                if segments.last() != Some(&Segment::AnyDirs) {
                    segments.push(Segment::AnyDirs);
                }
                continue;
            }
            segments.push(Segment::Glob(parse_segment(part)));
        }
        if segments.is_empty() {
            return Err(invalid(format!("matches nothing: {text:?}")));
        }
        let regex = RegexBuilder::new(&to_regex(&segments))
            .size_limit(ARTIFACT_PATTERN_REGEX_BYTES_MAX)
            .build()
            .map_err(|e| invalid(format!("cannot be compiled: {e}")))?;
        Ok(Self {
            regex,
            #[cfg(test)]
            segments: segments.len(),
        })
    }

    /// Whether `path` (relative, `/`-separated, no empty, `.` or `..` segments) matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if parts.is_empty() || parts.len() > ARTIFACT_PATH_SEGMENTS_MAX {
            return false;
        }
        self.regex.is_match(&parts.join("/"))
    }
}

/// The whole pattern as one anchored regular expression: a glob segment matches one path
/// segment, a `**` between segments any number of whole segments (zero included), a last
/// `**` one or more.
fn to_regex(segments: &[Segment]) -> String {
    let mut out = String::from("^");
    let mut after_segment = false;
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        if after_segment {
            out.push('/');
        }
        match segment {
            Segment::Glob(tokens) => {
                for token in tokens {
                    token.push_regex(&mut out);
                }
                after_segment = true;
            }
            Segment::AnyDirs if last => {
                out.push_str("[^/]+(?:/[^/]+)*");
                after_segment = true;
            }
            Segment::AnyDirs => {
                out.push_str("(?:[^/]+/)*");
                after_segment = false;
            }
        }
    }
    out.push('$');
    out
}

fn parse_segment(part: &str) -> Vec<Token> {
    let chars: Vec<char> = part.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                if tokens.last() != Some(&Token::Star) {
                    tokens.push(Token::Star);
                }
                i += 1;
            }
            '?' => {
                tokens.push(Token::AnyChar);
                i += 1;
            }
            '\\' if i + 1 < chars.len() => {
                tokens.push(Token::Literal(chars[i + 1]));
                i += 2;
            }
            '[' => match parse_class(&chars, i) {
                Some((token, next)) => {
                    tokens.push(token);
                    i = next;
                }
                None => {
                    tokens.push(Token::Literal('['));
                    i += 1;
                }
            },
            c => {
                tokens.push(Token::Literal(c));
                i += 1;
            }
        }
    }
    tokens
}

/// Parses the class opening at `chars[open]`; `None` when it never closes.
fn parse_class(chars: &[char], open: usize) -> Option<(Token, usize)> {
    let mut i = open + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let mut c = *chars.get(i)?;
        if c == ']' && !first {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        first = false;
        if c == '\\' {
            i += 1;
            c = *chars.get(i)?;
        }
        i += 1;
        let is_range = chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|n| *n != ']');
        if is_range {
            let mut hi = *chars.get(i + 1)?;
            i += 2;
            if hi == '\\' {
                hi = *chars.get(i)?;
                i += 1;
            }
            ranges.push((c, hi));
        } else {
            ranges.push((c, c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> ArtifactPattern {
        ArtifactPattern::parse("p", text).unwrap()
    }

    fn check(text: &str, yes: &[&str], no: &[&str]) {
        let p = pattern(text);
        for path in yes {
            assert!(p.matches(path), "{text:?} should match {path:?}");
        }
        for path in no {
            assert!(!p.matches(path), "{text:?} should not match {path:?}");
        }
    }

    #[test]
    fn star_stays_within_one_segment() {
        check(
            "*.txt",
            &["a.txt", ".txt", ".hidden.txt", "x.y.txt"],
            &["a.txt.bak", "dir/a.txt", "a.TXT", "atxt"],
        );
        check(
            "a*b*c",
            &["abc", "aXbYc", "abbbc", "acbc"],
            &["ab", "acb", "a/b/c"],
        );
        check("*", &["anything"], &["a/b"]);
    }

    #[test]
    fn segments_anchor_at_the_working_directory() {
        check(
            "reports/*.json",
            &["reports/a.json", "reports/.json"],
            &[
                "reports/sub/a.json",
                "x/reports/a.json",
                "reports/a.jsonl",
                "reports",
            ],
        );
        check("./reports//a.json", &["reports/a.json"], &["a.json"]);
    }

    #[test]
    fn double_star_spans_directories() {
        check(
            "coverage/**/*",
            &["coverage/a", "coverage/x/y/z.html"],
            &["coverage", "other/coverage/a", "coveragex/a"],
        );
        check(
            "**/*.log",
            &["a.log", "x/a.log", "x/y/z/a.log"],
            &["a.log.1", "x/a.txt"],
        );
        check(
            "coverage/**",
            &["coverage/a", "coverage/x/y"],
            &["coverage", "a/coverage/b"],
        );
        check(
            "a/**/b",
            &["a/b", "a/x/b", "a/x/y/b"],
            &["a/b/c", "b", "x/a/b"],
        );
        check("**", &["a", "a/b/c"], &[]);
        check("**/**/x", &["x", "a/x", "a/b/x"], &["x/a"]);
        check("a**b", &["ab", "axxb"], &["a/b"]);
        assert_eq!(pattern("**/**/**/x").segments, 2);
    }

    #[test]
    fn question_mark_and_classes() {
        check("?.md", &["a.md", "é.md"], &[".md", "ab.md", "/.md"]);
        check("[abc].rs", &["a.rs", "c.rs"], &["d.rs", "ab.rs"]);
        check("[a-c0-9]x", &["bx", "5x"], &["dx", "-x"]);
        check("[!a-c]x", &["dx", "Zx"], &["ax", "cx"]);
        check("[^a]x", &["bx"], &["ax"]);
        check("[]]x", &["]x"], &["ax"]);
        check("[!]]x", &["ax"], &["]x"]);
        check("[a-]x", &["ax", "-x"], &["bx"]);
        check("[unclosed", &["[unclosed"], &["u"]);
        check("[\\]]x", &["]x"], &["\\x"]);
    }

    #[test]
    fn backslash_escapes() {
        check("\\*.txt", &["*.txt"], &["a.txt"]);
        check("a\\?", &["a?"], &["ab"]);
        check("trailing\\", &["trailing\\"], &["trailing"]);
    }

    #[test]
    fn literal_paths_match_exactly() {
        check(
            "dist/app.tar.gz",
            &["dist/app.tar.gz"],
            &["dist/app.tar", "app.tar.gz", "dist/app.tar.gz/x"],
        );
    }

    #[test]
    fn bad_patterns_are_refused_with_the_field() {
        for text in ["", "/etc/passwd", "a/../b", "..", "a\nb", "/", "./"] {
            let err = ArtifactPattern::parse("lifecycle.artifact_patterns[3]", text).unwrap_err();
            assert!(
                err.to_string().contains("lifecycle.artifact_patterns[3]"),
                "{text:?}: {err}"
            );
        }
        let long = "a".repeat(ARTIFACT_PATTERN_BYTES_MAX + 1);
        assert!(ArtifactPattern::parse("p", &long).is_err());
    }

    #[test]
    fn pathological_patterns_stay_cheap() {
        // Backtracking matchers take exponential time here; the program does not.
        let p = pattern("**/a/".repeat(40).trim_end_matches('/'));
        let path = vec!["a"; 39].join("/");
        let started = std::time::Instant::now();
        assert!(!p.matches(&path));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let star = pattern(&format!("{}b", "*a".repeat(100)));
        let text = "a".repeat(200);
        assert!(!star.matches(&text));
        let deep = vec!["d"; ARTIFACT_PATH_SEGMENTS_MAX + 1].join("/");
        assert!(!pattern("**").matches(&deep));
    }
}
