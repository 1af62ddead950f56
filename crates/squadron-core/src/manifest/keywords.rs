//! The keyword values of a manifest (`runtime: docker`, `failure_action: preserve`).
//!
//! Names, `Display`, `FromStr` and the variant lists are derived by `strum`, spelled
//! `snake_case` exactly as serde spells them (`keyword_names_match_serde_names` checks it). Only
//! the parse error is ours: it names the field and lists the allowed values, and clients and
//! tests rely on its wording.

use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strum::{Display, EnumString, IntoStaticStr, VariantArray};

use crate::validation_error::ValidationError;

/// A closed set of names a manifest field takes.
pub trait Keyword:
    Copy + Into<&'static str> + FromStr<Err = ValidationError> + VariantArray + 'static
{
    /// What a value is called in errors: `unknown runtime "lxc"`.
    const WHAT: &'static str;
    /// Every value, in declaration order.
    const ALL: &'static [Self] = <Self as VariantArray>::VARIANTS;

    fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses `s`, naming `field` in the error.
    fn parse(field: &str, s: &str) -> Result<Self, ValidationError> {
        s.parse()
            .map_err(|e: ValidationError| ValidationError::new(field, e.reason))
    }
}

/// The error of `FromStr` for a name none of `K`'s values has. It names the keyword, as a bare
/// `str::parse` knows no field; [`Keyword::parse`] puts the field path in its place.
fn unknown<K: Keyword>(s: &str) -> ValidationError {
    let expected: Vec<&str> = K::ALL.iter().map(|v| v.as_str()).collect();
    ValidationError::new(
        K::WHAT,
        format!(
            "unknown {} {s:?}; expected one of {}",
            K::WHAT,
            expected.join(", ")
        ),
    )
}

/// Queue priority, set by the `priority` label. Declaration order is queue order.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    Display,
    EnumString,
    IntoStaticStr,
    VariantArray,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[strum(parse_err_ty = ValidationError, parse_err_fn = unknown::<TaskPriority>)]
pub enum TaskPriority {
    Low,
    #[default]
    Normal,
    High,
    Critical,
}

impl Keyword for TaskPriority {
    const WHAT: &'static str = "priority";
}

impl TaskPriority {
    /// 0 for `low` up to 3 for `critical`.
    pub fn rank(self) -> u8 {
        match self {
            TaskPriority::Low => 0,
            TaskPriority::Normal => 1,
            TaskPriority::High => 2,
            TaskPriority::Critical => 3,
        }
    }
}

/// What the sandbox may reach on the network.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    Display,
    EnumString,
    IntoStaticStr,
    VariantArray,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[strum(parse_err_ty = ValidationError, parse_err_fn = unknown::<NetworkMode>)]
pub enum NetworkMode {
    /// No network at all.
    Isolated,
    /// Outbound connections only; inbound restricted to the management host.
    #[default]
    Outbound,
    /// Unrestricted.
    Full,
    /// Egress only through the worker's HTTP CONNECT proxy, to the destinations its gateway
    /// allow list names; each connection is logged to the task's events. Last, so earlier
    /// encodings keep their variant numbers.
    Gateway,
}

impl Keyword for NetworkMode {
    const WHAT: &'static str = "network_mode";
}

/// The kind of sandbox a worker must offer to run the task.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    Display,
    EnumString,
    IntoStaticStr,
    VariantArray,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[strum(parse_err_ty = ValidationError, parse_err_fn = unknown::<RuntimeKind>)]
pub enum RuntimeKind {
    /// A plain process on the worker host.
    #[default]
    Process,
    /// A Docker container.
    Docker,
    /// A KVM virtual machine.
    Kvm,
}

impl Keyword for RuntimeKind {
    const WHAT: &'static str = "runtime";
}

/// What happens to the sandbox when the task fails.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    Display,
    EnumString,
    IntoStaticStr,
    VariantArray,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[strum(parse_err_ty = ValidationError, parse_err_fn = unknown::<FailureAction>)]
pub enum FailureAction {
    #[default]
    Destroy,
    /// Keep the sandbox running for debugging.
    Preserve,
}

impl Keyword for FailureAction {
    const WHAT: &'static str = "failure_action";
}

/// When a startup profile runs.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    Display,
    EnumString,
    IntoStaticStr,
    VariantArray,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[strum(parse_err_ty = ValidationError, parse_err_fn = unknown::<StartupTrigger>)]
pub enum StartupTrigger {
    #[default]
    OnInstanceReady,
}

impl Keyword for StartupTrigger {
    const WHAT: &'static str = "trigger";
}
