//! The names of the worker's own environment variables a sandbox may inherit.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::WorkerError;

/// Names in one allowlist.
pub(crate) const ENV_ALLOWLIST_NAMES_MAX: usize = 64;
/// Length of one variable name.
pub(crate) const ENV_NAME_BYTES_MAX: usize = 128;
/// Length of one inherited value; longer values are not passed.
pub(crate) const ENV_VALUE_BYTES_MAX: usize = 32 * 1024;
/// Variables the launcher always sets itself; the allowlist cannot override them.
pub(crate) const ENV_RESERVED_NAMES: [&str; 6] = [
    "PATH",
    "HOME",
    "LANG",
    "TERM",
    "SQUADRON_TASK_ID",
    "SQUADRON_ATTEMPT",
];

/// Variable names copied from the worker's environment into every sandbox, when set there
/// (e.g. a provider's API key until credential leases exist). Empty by default: nothing of
/// the worker's environment leaks in unless named here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EnvAllowlist {
    names: BTreeSet<String>,
}

impl EnvAllowlist {
    /// Checks each name (`[A-Za-z_][A-Za-z0-9_]*`, not one of [`ENV_RESERVED_NAMES`]).
    pub(crate) fn new<I, S>(names: I) -> Result<Self, WorkerError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut set = BTreeSet::new();
        for (i, name) in names.into_iter().enumerate() {
            let name = name.into();
            let field = format!("env_allowlist[{i}]");
            let invalid = |message: String| WorkerError::Invalid {
                field: field.clone(),
                message,
            };
            if name.is_empty() || name.len() > ENV_NAME_BYTES_MAX {
                return Err(invalid(format!(
                    "must be 1 to {ENV_NAME_BYTES_MAX} bytes, got {}",
                    name.len()
                )));
            }
            let mut chars = name.chars();
            let first_ok = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
            if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(invalid(format!(
                    "{name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
                )));
            }
            if ENV_RESERVED_NAMES.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "{name} is set by the launcher and cannot be inherited"
                )));
            }
            set.insert(name);
            if set.len() > ENV_ALLOWLIST_NAMES_MAX {
                return Err(WorkerError::Invalid {
                    field: "env_allowlist".into(),
                    message: format!("must have at most {ENV_ALLOWLIST_NAMES_MAX} names"),
                });
            }
        }
        Ok(Self { names: set })
    }

    #[cfg(test)]
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The allowlisted variables `lookup` knows, skipping values longer than
    /// [`ENV_VALUE_BYTES_MAX`] or holding a NUL.
    pub(crate) fn resolve_with(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> BTreeMap<String, String> {
        self.names
            .iter()
            .filter_map(|name| {
                let value = lookup(name)?;
                (value.len() <= ENV_VALUE_BYTES_MAX && !value.contains('\0'))
                    .then(|| (name.clone(), value))
            })
            .collect()
    }

    /// The allowlisted variables of the worker's own environment.
    pub(crate) fn resolve(&self) -> BTreeMap<String, String> {
        self.resolve_with(|name| std::env::var(name).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let list = EnvAllowlist::new(["ANTHROPIC_API_KEY", "_X", "OPENAI_API_KEY"]).unwrap();
        assert_eq!(
            list.names().collect::<Vec<_>>(),
            ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "_X"]
        );
        for (bad, why) in [
            ("", "1 to"),
            ("1ABC", "not a variable name"),
            ("A-B", "not a variable name"),
            ("A=B", "not a variable name"),
            ("PATH", "set by the launcher"),
            ("SQUADRON_TASK_ID", "set by the launcher"),
        ] {
            let err = EnvAllowlist::new(["OK", bad]).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("env_allowlist[1]") && text.contains(why),
                "{bad:?}: {text}"
            );
        }
        let many: Vec<String> = (0..=ENV_ALLOWLIST_NAMES_MAX)
            .map(|i| format!("V{i}"))
            .collect();
        assert!(EnvAllowlist::new(many).is_err());
    }

    #[test]
    fn only_allowlisted_set_and_sane_values_resolve() {
        let list = EnvAllowlist::new(["A", "B", "LONG", "NUL"]).unwrap();
        let env = list.resolve_with(|name| match name {
            "A" => Some("1".into()),
            "LONG" => Some("x".repeat(ENV_VALUE_BYTES_MAX + 1)),
            "NUL" => Some("a\0b".into()),
            "C" => Some("never asked".into()),
            _ => None,
        });
        assert_eq!(env, BTreeMap::from([("A".to_string(), "1".to_string())]));
    }
}
