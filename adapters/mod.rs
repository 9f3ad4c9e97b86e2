//! The wrapped CLIs: one module per agent, each a [`crate::cli::adapter::Adapter`] value and the layers it
//! stacks. The engine (`src/`) knows none of them by name; a binary is `adapters/<agent>/main.rs`.

pub mod acp;
pub mod codex;
pub mod grok;
pub mod kimi;
pub mod opencode;

use crate::cli::adapter::Adapter;

/// Every adapter, for tools that pick one by its agent name (`acp-replay`).
pub fn all() -> [Adapter; 4] {
    [codex::adapter(), grok::adapter(), kimi::adapter(), opencode::adapter()]
}

/// The adapter whose [`Adapter::agent`] is `agent`; `acp` is coda-acp with no profile, `acp-<profile>` coda-acp
/// with a built-in profile (fixtures of coda-acp are kept per profile: `fixtures/acp-<profile>/`).
pub fn by_agent(agent: &str) -> Option<Adapter> {
    if agent == "acp" {
        return Some(acp::adapter(None));
    }
    if let Some(profile) = agent.strip_prefix("acp-") {
        return acp::profile::built_in(profile).ok().map(|p| acp::adapter(Some(p)));
    }
    all().into_iter().find(|a| a.agent == agent)
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_adapter_is_found_by_its_own_name_and_has_its_own_data_home() {
        let all = super::all();
        for adapter in &all {
            assert_eq!(super::by_agent(adapter.agent).map(|a| a.binary()), Some(adapter.binary()));
            let others = all.iter().filter(|a| a.agent != adapter.agent);
            assert!(others.clone().all(|a| a.data_home.dir_with(|_| None) != adapter.data_home.dir_with(|_| None)));
        }
        assert!(super::by_agent("nobody").is_none());
        assert_eq!(super::by_agent("acp-qwen").map(|a| a.cli_name), Some("Qwen Code"));
        assert_eq!(super::by_agent("acp").map(|a| a.binary()), Some("coda-acp".to_owned()));
        assert!(super::by_agent("acp-nobody").is_none());
        let kimi = super::by_agent("kimi").expect("kimi");
        assert_eq!(
            (kimi.data_home.var, kimi.data_home.default, kimi.data_home.owns_var()),
            ("KIMI_CODE_HOME", ".kimi-code", true)
        );
        let opencode = super::by_agent("opencode").expect("opencode");
        assert!(!opencode.data_home.owns_var(), "XDG_DATA_HOME is shared by every XDG program");
    }
}
