//! Quoting for the POSIX `sh` scripts the worker writes (`launch.sh`).

/// Quotes `word` so that `sh` reads it back as exactly one word with exactly these bytes.
///
/// Words made only of characters no shell treats specially are left bare, so generated scripts
/// stay readable; anything else is wrapped in single quotes, inside which `sh` interprets
/// nothing, and each embedded `'` becomes `'\''`. A NUL byte cannot be passed in an argument at
/// all; callers refuse such words before quoting.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if plain {
        return word.to_string();
    }
    let mut quoted = String::with_capacity(word.len() + 2);
    quoted.push('\'');
    for c in word.chars() {
        if c == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Asks a real `/bin/sh` to print each quoted word on its own NUL-terminated record.
    fn round_trip(words: &[&str]) -> Vec<String> {
        let script = format!(
            "printf '%s\\0' {}",
            words
                .iter()
                .map(|w| shell_quote(w))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let mut parts: Vec<String> = text.split('\0').map(str::to_string).collect();
        assert_eq!(parts.pop().as_deref(), Some(""));
        parts
    }

    #[test]
    fn plain_words_stay_bare() {
        for word in [
            "claude",
            "--print",
            "a,b",
            "/mnt/run/launch.sh",
            "x=1",
            "user@host:path",
        ] {
            assert_eq!(shell_quote(word), word);
        }
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn the_shell_reads_back_every_byte() {
        let words = [
            "",
            "plain",
            "two words",
            "it's",
            "''",
            "\"double\"",
            "$HOME",
            "${PATH}",
            "$(id)",
            "`id`",
            "line1\nline2\n",
            "tab\there",
            "back\\slash\\",
            "glob * ? [a-z]",
            "semi; rm -rf / && echo | cat > x < y &",
            "~user",
            "#comment",
            "!bang",
            "unicode é ✓",
            "-n",
        ];
        assert_eq!(round_trip(&words), words);
    }
}
