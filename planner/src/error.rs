//! The planner's errors about its settings and inputs: which field is wrong and why, and unknown policy names.

/// A setting or input field that is out of range or inconsistent with the rest: its path, dotted from the
/// structure that was checked (`config.slot_s`, `tenants.t1.forecast`, `pairs[2]`), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidField {
    /// The field's path.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl InvalidField {
    /// `field` is wrong: `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> InvalidField {
        InvalidField { field: field.into(), problem: problem.into() }
    }

    /// The same error seen from the structure that holds the checked one under `prefix`: `pairs[0]` within
    /// `interference` is `interference.pairs[0]`.
    pub fn within(mut self, prefix: &str) -> InvalidField {
        self.field = format!("{prefix}.{}", self.field);
        self
    }

    /// The same error with the first element of its path, `from`, named `to` (`config.slot_s` as `planner.slot_s`);
    /// unchanged where the path starts otherwise.
    pub fn renamed(mut self, from: &str, to: &str) -> InvalidField {
        if let Some(rest) = self.field.strip_prefix(from).filter(|r| r.is_empty() || r.starts_with('.')) {
            self.field = format!("{to}{rest}");
        }
        self
    }
}

/// A policy name that no registered policy or ablation has ([`crate::policies::by_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {name:?} (known: {})", known.join(", "))]
pub struct UnknownPolicy {
    /// The name asked for.
    pub name: String,
    /// Every name there is.
    pub known: Vec<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compose_and_rename_whole_elements_only() {
        let e = InvalidField::new("pairs[0]", "a model name is empty").within("interference");
        assert_eq!(e.to_string(), "interference.pairs[0]: a model name is empty");
        let e = InvalidField::new("config.slot_s", "must be > 0 (got 0)");
        assert_eq!(e.clone().renamed("config", "planner").field, "planner.slot_s");
        assert_eq!(e.renamed("conf", "planner").field, "config.slot_s");
    }
}
