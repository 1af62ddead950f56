//! Quoting for POSIX `sh`: the shim script embeds cgroup paths, log paths and the whole
//! bubblewrap argv, any of which may hold spaces, quotes or `$`.

/// Quotes `word` so that `sh` reads it back as exactly one word with the same bytes.
///
/// Plain words made only of safe characters are returned as they are (readable scripts);
/// everything else goes in single quotes, where nothing is special except `'` itself, which
/// becomes `'\''`. The empty string becomes `''`.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b));
    if plain {
        return word.to_owned();
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

/// Quotes every word and joins them with spaces: a command line for `sh`.
pub fn shell_join<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn plain_words_stay_readable() {
        assert_eq!(
            shell_quote("/sys/fs/cgroup/unified/a-b_c.d"),
            "/sys/fs/cgroup/unified/a-b_c.d"
        );
        assert_eq!(shell_quote("--ro-bind"), "--ro-bind");
        assert_eq!(shell_quote("PATH=/usr/bin:/bin"), "PATH=/usr/bin:/bin");
    }

    #[test]
    fn special_words_are_single_quoted() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("`id`;rm -rf /"), "'`id`;rm -rf /'");
    }

    /// The real proof: `sh` must hand every word back byte for byte, as one argument each.
    #[test]
    fn sh_reads_back_exactly_the_words_given() {
        let words = [
            "plain",
            "",
            "with space",
            "it's",
            "''",
            "\"double\"",
            "$HOME $(id) `id`",
            "back\\slash",
            "new\nline",
            "tab\there",
            "glob * ? [a]",
            "semi;colon&amp|pipe>redir<in",
            "~tilde",
            "#hash",
            "ünïcødé ✓",
            "-n",
        ];
        let script = format!(
            "for w in {}; do printf '%s\\0' \"$w\"; done",
            shell_join(&words)
        );
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .env_clear()
            .output()
            .expect("run /bin/sh");
        assert!(out.status.success(), "sh failed: {out:?}");
        let got: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .map(|w| String::from_utf8(w.to_vec()).expect("utf-8"))
            .collect();
        // printf ends every word with NUL, so the split leaves one empty tail.
        assert_eq!(got.len(), words.len() + 1);
        assert_eq!(&got[..words.len()], &words[..]);
    }
}
