//! A provider's progress on the wire: the core's [`ProviderProgress`] to its protobuf message
//! and back. Absent names travel as empty strings, an absent cost as `has_cost: false`; the
//! core validates what arrives (`ProviderProgress::validate`).

use squadron_core::task::ProviderProgress;

use crate::v1 as pb;

impl From<&ProviderProgress> for pb::ProviderProgress {
    fn from(p: &ProviderProgress) -> Self {
        pb::ProviderProgress {
            model: p.model.clone().unwrap_or_default(),
            tool_calls: p.tool_calls,
            current_tool: p.current_tool.clone().unwrap_or_default(),
            input_tokens: p.input_tokens,
            output_tokens: p.output_tokens,
            cost_micro_usd: p.cost_micro_usd.unwrap_or_default(),
            has_cost: p.cost_micro_usd.is_some(),
            turns: p.turns,
        }
    }
}

impl From<pb::ProviderProgress> for ProviderProgress {
    fn from(p: pb::ProviderProgress) -> Self {
        let named = |s: String| (!s.is_empty()).then_some(s);
        ProviderProgress {
            model: named(p.model),
            tool_calls: p.tool_calls,
            current_tool: named(p.current_tool),
            input_tokens: p.input_tokens,
            output_tokens: p.output_tokens,
            cost_micro_usd: p.has_cost.then_some(p.cost_micro_usd),
            turns: p.turns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_survives_the_wire_with_what_it_lacks() {
        let full = ProviderProgress {
            model: Some("claude-scripted-1".into()),
            tool_calls: 5,
            current_tool: Some("Bash".into()),
            input_tokens: 600,
            output_tokens: 120,
            cost_micro_usd: Some(0),
            turns: 4,
        };
        assert_eq!(
            ProviderProgress::from(pb::ProviderProgress::from(&full)),
            full
        );
        let bare = ProviderProgress::default();
        assert_eq!(
            ProviderProgress::from(pb::ProviderProgress::from(&bare)),
            bare
        );
    }
}
