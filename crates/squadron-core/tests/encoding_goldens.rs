//! Golden encodings of every command: the serde_json form (follower forwarding, REST bodies),
//! the log codec's bincode form (Raft log entries, snapshots) and the command fingerprint (what
//! the idempotency ledger in every snapshot binds a key to).
//!
//! The values were produced by the code as it stood before commands became named structs and
//! must never change: a changed byte here means existing logs, snapshots or forwarded
//! proposals would no longer decode or would fingerprint differently. Commands are built by
//! decoding the JSON goldens, so this file needs no edit when the Rust shape of `Command`
//! changes and keeps proving the wire stays the same.
//!
//! Log encoding 2 added the subject of every command. The version-1 goldens below must still
//! decode (as `Subject::Legacy`) and fingerprint as they did, so an old data directory replays
//! and its idempotency ledger still answers retries; `V2_LOG_GOLDENS` pins the new encoding.

use squadron_core::access::{Subject, TokenId};
use squadron_core::codec::{command_fingerprint, decode_command, encode_command};
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, CommandEnvelope};

struct Golden {
    name: &'static str,
    at_ms: u64,
    idempotency_key: Option<&'static str>,
    /// `serde_json::to_string(&command)`.
    json: &'static str,
    /// `encode_command` of the envelope `{ at_ms, idempotency_key, command }`, in hex.
    log_hex: &'static str,
    /// `command_fingerprint(&command)`, in hex.
    fingerprint: &'static str,
}

/// `encode_command` of each golden's envelope with subject `operator()`, in hex (log encoding
/// 2), in the order of `GOLDENS`.
const V2_LOG_GOLDENS: &[(&str, &str)] = &[
    ("create_project", "02fd0000018bcfe5680001056b65792d30031030303131323233336161626263636464000461636d6503776562010800"),
    ("attach_sandbox", "02fd0000018bcfe5680100031030303131323233336161626263636464010461636d6503776562027731010973616e64626f782d31"),
    ("detach_sandbox", "02fd0000018bcfe5680201056b65792d32031030303131323233336161626263636464020461636d65037765620973616e64626f782d31"),
    ("create_profile", "02fd0000018bcfe5680300031030303131323233336161626263636464030461636d650377656208726576696577657202000101056374782d31"),
    ("set_capability_manifest", "02fd0000018bcfe5680401056b65792d340310303031313232333361616262636364640403020104727573740206676974687562046a697261"),
    ("grant_mcp_use", "02fd0000018bcfe5680500031030303131323233336161626263636464050306676974687562"),
    ("revoke_mcp_use", "02fd0000018bcfe5680601056b65792d360310303031313232333361616262636364640603046a697261"),
    ("acquire_lease", "02fd0000018bcfe568070003103030313132323333616162626363646407030100027731127069642034323432206f6e20686f73742d6101167371756164726f6e2f61636d652f7765622f6c656166fb2710"),
    ("renew_lease", "02fd0000018bcfe5680801056b65792d3803103030313132323333616162626363646408030702fb2710"),
    ("renew_leases", "02fd0000018bcfe56809000310303031313232333361616262636364640902773102030702040801fb3a98"),
    ("release_lease", "02fd0000018bcfe5680a01066b65792d31300310303031313232333361616262636364640a030702"),
    ("fence_lease", "02fd0000018bcfe5680b000310303031313232333361616262636364640b03070202"),
    ("record_reap_evidence", "02fd0000018bcfe5680c01066b65792d31320310303031313232333361616262636364640c030702167371756164726f6e2f61636d652f7765622f6c65616600fc0001e24000"),
    ("graceful_takeover", "02fd0000018bcfe5680d000310303031313232333361616262636364640d03070204014061626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162010768616c66776179010c6b65657020746865206170690205746573747304646f6373076162633132333409056374782d310001027731127069642034323432206f6e20686f73742d6101167371756164726f6e2f61636d652f7765622f6c656166fb7530010702167371756164726f6e2f61636d652f7765622f6c65616600fc0001e24000"),
    ("crash_takeover", "02fd0000018bcfe5680e01066b65792d31340310303031313232333361616262636364640e03070201027731127069642034323432206f6e20686f73742d6101167371756164726f6e2f61636d652f7765622f6c656166fb7530010702167371756164726f6e2f61636d652f7765622f6c65616600fc0001e24001036f707309686f737420676f6e65"),
    ("commit_capsule", "02fd0000018bcfe5680f000310303031313232333361616262636364640f0307020400010768616c66776179010c6b65657020746865206170690205746573747304646f6373076162633132333409056374782d31014031313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131"),
    ("post_message", "02fd0000018bcfe5681001066b65792d3136031030303131323233336161626263636464100400030702000b6f76657220746f20796f75"),
    ("ack_messages", "02fd0000018bcfe5681100031030303131323233336161626263636464110307020c"),
    ("submit_task", "02fd0000018bcfe5681201066b65792d3138031030303131323233336161626263636464121150696e2074686520656e636f64696e677302087072696f726974790468696768047465616d08706c6174666f726d021b68747470733a2f2f6769746875622e636f6d2f6f72672f7265706f01046d61696e010761626331323334010d7061636b616765732f61757468145265666163746f7220746865206d6f64756c652e0111636c617564652d736f6e6e65742d342d350164010204526561640557726974650100010b6167656e7469632d646576010401fd000000020000000001fd0000000a00000000000101010461636d65037765620872657669657765720109737461727475702d6100196167656e7469632d636c617564652d6175746f6d6174696f6e0a2f776f726b7370616365781e0106637265645f61056b65795f610106636c6175646504617574680573686f72740a736563726574732d7631fc006ddd00fc000927c0fc000493e0fc000dbba0fb4e200102072a2e70617463680e7265706f7274732f2a2e6a736f6e0200060202fb03e8fb13880101fb27100401fb07d0"),
    ("assign_tasks", "02fd0000018bcfe568130003103030313132323333616162626363646413020502773106027732"),
    ("report_transition", "02fd0000018bcfe5681401066b65792d32300310303031313232333361616262636364641405027731010405010001046e6f6e6501096f75742e7061746368"),
    ("report_progress", "02fd0000018bcfe5681500031030303131323233336161626263636464150502773101fb04000c2803"),
    ("cancel_task", "02fd0000018bcfe5681601066b65792d323203103030313132323333616162626363646416050a73757065727365646564"),
    ("register_worker", "02fd0000018bcfe5681700031030303131323233336161626263636464170277310d31302e302e302e353a393030300200020401047a6f6e650161fb1388"),
    ("worker_heartbeat", "02fd0000018bcfe5681801066b65792d323403103030313132323333616162626363646418027731"),
    ("decommission_worker", "02fd0000018bcfe568190003103030313132323333616162626363646419027732036f707309686f737420676f6e65"),
    ("sweep", "02fd0000018bcfe5681a01066b65792d32360310303031313232333361616262636364641a"),
    ("batch", "02fd0000018bcfe5681b000310303031313232333361616262636364641b0201036b2d3101180277310001160603647570"),
];

/// Commands that came with log encoding 2 (no version-1 form): their JSON and, with subject
/// `operator()` at `at_ms` 1700000000100 and no key, their log encoding in hex.
const NEW_GOLDENS: &[(&str, &str, &str)] = &[
    ("create_operator_token", r#"{"create_operator_token":{"id":"0123456789abcdef","digest":"abababababababababababababababababababababababababababababababab","role":"operator","scope":[{"tenant":"acme","project":"web"}],"name":"ci","expires_at_ms":1800000000000}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364641c1030313233343536373839616263646566406162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616201010461636d65010377656202636901fd000001a3185c5000"),
    ("revoke_operator_token", r#"{"revoke_operator_token":{"id":"0123456789abcdef"}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364641d1030313233343536373839616263646566"),
    ("mint_bootstrap_token", r#"{"mint_bootstrap_token":{"id":"fedcba9876543210","digest":"abababababababababababababababababababababababababababababababab","purpose":{"worker":{"worker":"w1"}},"expires_at_ms":1700000600000}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364641e106665646362613938373635343332313040616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261620001027731fd0000018bcfee8fc0"),
    ("enroll", r#"{"enroll":{"token":"fedcba9876543210","presented":"abababababababababababababababababababababababababababababababab","identity":{"worker":"w1"},"serial":"0a1b2c","not_after_ms":1700086400000}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364641f106665646362613938373635343332313040616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261620002773106306131623263fd0000018bd50bc400"),
    ("record_certificate", r#"{"record_certificate":{"identity":{"agent":{"task":7}},"serial":"0a1b2d","not_after_ms":1700086400000}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642001000706306131623264fd0000018bd50bc400"),
    ("revoke_identity", r#"{"revoke_identity":{"identity":{"worker":"w1"},"reason":"host retired"}}"#, "02fd0000018bcfe568640003103030313132323333616162626363646421000277310c686f73742072657469726564"),
    ("put_credential", r#"{"put_credential":{"id":"cred_a","description":"ci key","sealed":{"key_id":"0123456789abcdef","nonce":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"ciphertext":[7,7,7,7]}}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642206637265645f61066369206b65791030313233343536373839616263646566180101010101010101010101010101010101010101010101010407070707"),
    ("rotate_credential", r#"{"rotate_credential":{"id":"cred_a","sealed":{"key_id":"0123456789abcdef","nonce":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"ciphertext":[7,7,7,7]}}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642306637265645f611030313233343536373839616263646566180101010101010101010101010101010101010101010101010407070707"),
    ("revoke_credential", r#"{"revoke_credential":{"id":"cred_a"}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642406637265645f61"),
    ("grant_credential_lease", r#"{"grant_credential_lease":{"task":7,"worker":"w1","attempt":1}}"#, "02fd0000018bcfe5686400031030303131323233336161626263636464250702773101"),
    ("set_worker_policy", r#"{"set_worker_policy":{"worker":"w1","policy":{"network_modes":["isolated","outbound"],"full_control":false,"repository_sources":["https","ssh","local"],"cpus_max":4,"memory_bytes_max":null,"disk_bytes_max":null}}}"#, "02fd0000018bcfe568640003103030313132323333616162626363646426027731020001000300020401040000"),
    ("request_agent_operation", r#"{"request_agent_operation":{"profile":5,"operation":"takeover","worker":"w1"}}"#, "02fd0000018bcfe5686400031030303131323233336161626263636464270501027731"),
    ("agent_check_in", r#"{"agent_check_in":{"task":7,"attempt":1,"usage":{"cpu_usec":1500,"memory_bytes":4096,"disk_bytes":100},"exit_code":3}}"#, "02fd0000018bcfe568640003103030313132323333616162626363646428070101fb05dcfb1000640106"),
    ("assign_project_tasks", r#"{"assign_project_tasks":{"assignments":[{"task":7,"worker":"w1"}]}}"#, "02fd0000018bcfe5686400031030303131323233336161626263636464290107027731"),
    ("set_profile_credentials", r#"{"set_profile_credentials":{"profile":3,"credential_refs":[{"id":"cred_a","mount":"anthropic_api_key"}]}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642a030106637265645f6111616e7468726f7069635f6170695f6b6579"),
    ("grant_agent_credential_lease", r#"{"grant_agent_credential_lease":{"fence":{"profile":3,"lease":5,"generation":2},"worker":"w1"}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642b030502027731"),
    ("set_credential_egress", r#"{"set_credential_egress":{"id":"cred_a","egress":null}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642c06637265645f6100"),
    ("register_worker_with_policy", r#"{"register_worker_with_policy":{"registration":{"worker":"w1","address":"127.0.0.1:9000","runtimes":["process"],"capacity":2,"labels":{},"heartbeat_interval_ms":1000},"policy":{"network_modes":["isolated","outbound"],"full_control":false,"repository_sources":["https","ssh","local"],"cpus_max":4,"memory_bytes_max":null,"disk_bytes_max":null}}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642d0277310e3132372e302e302e313a3930303001000200fb03e8020001000300020401040000"),
    ("leader_sweep", r#"{"leader_sweep":{"term_started_ms":1700000000050}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642efd0000018bcfe56832"),
    ("prune_tasks", r#"{"prune_tasks":{"age_ms_max":604800000,"count_max":100000}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364642ffc240c8400fc000186a0"),
    ("report_progress_v2", r#"{"report_progress_v2":{"counts":{"task":5,"worker":"w1","attempt":1,"stdout_bytes":1024,"stderr_bytes":12,"lines":40,"events":3},"provider":{"model":"claude-scripted-1","tool_calls":2,"current_tool":"Bash","input_tokens":600,"output_tokens":120,"cost_micro_usd":4800,"turns":1}}}"#, "02fd0000018bcfe5686400031030303131323233336161626263636464300502773101fb04000c2803010111636c617564652d73637269707465642d3102010442617368fb02587801fb12c001"),
    ("regrant_agent_credential_lease", r#"{"regrant_agent_credential_lease":{"fence":{"profile":3,"lease":5,"generation":2},"worker":"w1","only_lease":7}}"#, "02fd0000018bcfe56864000310303031313232333361616262636364643103050202773107"),
    ("regrant_credential_lease", r#"{"regrant_credential_lease":{"task":5,"worker":"w1","attempt":1,"only_lease":7}}"#, "02fd0000018bcfe568640003103030313132323333616162626363646432050277310107"),

];

/// Every `Command` variant once, in declaration order; the last is a batch holding two.
const GOLDENS: &[Golden] = &[
    Golden {
        name: "create_project",
        at_ms: 1700000000000,
        idempotency_key: Some("key-0"),
        json: r#"{"create_project":{"tenant":"acme","project":"web","max_profiles":8,"max_active":null}}"#,
        log_hex: "01fd0000018bcfe5680001056b65792d30000461636d6503776562010800",
        fingerprint: "96f8580f3edf27091c4185e11335d89d8a23d998381fa6fa6c53b890756e4d0b",
    },
    Golden {
        name: "attach_sandbox",
        at_ms: 1700000000001,
        idempotency_key: None,
        json: r#"{"attach_sandbox":{"tenant":"acme","project":"web","worker":"w1","runtime":"docker","sandbox_ref":"sandbox-1"}}"#,
        log_hex: "01fd0000018bcfe5680100010461636d6503776562027731010973616e64626f782d31",
        fingerprint: "e82a154258b2c41c3bc6ed7061720bd69b97c1edaca8c6ba494009bda5f2d5a2",
    },
    Golden {
        name: "detach_sandbox",
        at_ms: 1700000000002,
        idempotency_key: Some("key-2"),
        json: r#"{"detach_sandbox":{"tenant":"acme","project":"web","sandbox_ref":"sandbox-1"}}"#,
        log_hex: "01fd0000018bcfe5680201056b65792d32020461636d65037765620973616e64626f782d31",
        fingerprint: "d3ba2f8dbeeb3c0568afa5b0f1f171af042dbc94a6be6697cf47f1bf882b3ba8",
    },
    Golden {
        name: "create_profile",
        at_ms: 1700000000003,
        idempotency_key: None,
        json: r#"{"create_profile":{"tenant":"acme","project":"web","key":"reviewer","providers":["codex","claude"],"context_ref":"ctx-1"}}"#,
        log_hex: "01fd0000018bcfe5680300030461636d650377656208726576696577657202000101056374782d31",
        fingerprint: "d9fe2b96e75de9102a93b52ed1f4cabcf25704f464e7f835f28bd5c8482a2787",
    },
    Golden {
        name: "set_capability_manifest",
        at_ms: 1700000000004,
        idempotency_key: Some("key-4"),
        json: r#"{"set_capability_manifest":{"profile":3,"expected_version":2,"required_skills":["rust"],"mcp_servers":["github","jira"]}}"#,
        log_hex: "01fd0000018bcfe5680401056b65792d340403020104727573740206676974687562046a697261",
        fingerprint: "d8ffb4d8f49f9e9dce27dbb5f75ac7478bc8262851792d8dfcbbde896e02cb97",
    },
    Golden {
        name: "grant_mcp_use",
        at_ms: 1700000000005,
        idempotency_key: None,
        json: r#"{"grant_mcp_use":{"profile":3,"server":"github"}}"#,
        log_hex: "01fd0000018bcfe5680500050306676974687562",
        fingerprint: "43b3f8fd010c247c0d9c625b20e14a57d75afebf6b72e059b7df6ca0b40dacda",
    },
    Golden {
        name: "revoke_mcp_use",
        at_ms: 1700000000006,
        idempotency_key: Some("key-6"),
        json: r#"{"revoke_mcp_use":{"profile":3,"server":"jira"}}"#,
        log_hex: "01fd0000018bcfe5680601056b65792d360603046a697261",
        fingerprint: "70e0f9242352a892514055c2cd691cc1c86fbf2ea7f962dd7544c0ef0b07f9b1",
    },
    Golden {
        name: "acquire_lease",
        at_ms: 1700000000007,
        idempotency_key: None,
        json: r#"{"acquire_lease":{"profile":3,"expected_generation":1,"provider":"codex","holder":{"worker":"w1","process":"pid 4242 on host-a","cgroup":"squadron/acme/web/leaf"},"ttl_ms":10000}}"#,
        log_hex: "01fd0000018bcfe568070007030100027731127069642034323432206f6e20686f73742d6101167371756164726f6e2f61636d652f7765622f6c656166fb2710",
        fingerprint: "5d6c37f60ed4725eba8742a542e0b3ce1ef3bcc72663c41037f0aab9fa94f2c0",
    },
    Golden {
        name: "renew_lease",
        at_ms: 1700000000008,
        idempotency_key: Some("key-8"),
        json: r#"{"renew_lease":{"fence":{"profile":3,"lease":7,"generation":2},"ttl_ms":10000}}"#,
        log_hex: "01fd0000018bcfe5680801056b65792d3808030702fb2710",
        fingerprint: "45cdc1729ba5d80680c366ae0ec85e26aa75a38284ec9e5be9afc1cbb445ceaf",
    },
    Golden {
        name: "renew_leases",
        at_ms: 1700000000009,
        idempotency_key: None,
        json: r#"{"renew_leases":{"worker":"w1","fences":[{"profile":3,"lease":7,"generation":2},{"profile":4,"lease":8,"generation":1}],"ttl_ms":15000}}"#,
        log_hex: "01fd0000018bcfe56809000902773102030702040801fb3a98",
        fingerprint: "5722fa5c2882c16c328ebfa12bef91a4a28ca179f091a9ed5421c180edabd281",
    },
    Golden {
        name: "release_lease",
        at_ms: 1700000000010,
        idempotency_key: Some("key-10"),
        json: r#"{"release_lease":{"fence":{"profile":3,"lease":7,"generation":2}}}"#,
        log_hex: "01fd0000018bcfe5680a01066b65792d31300a030702",
        fingerprint: "f8e7355c2ebea3eef7160be74a8465f033504ec3a7b357f030c38fbba25416f8",
    },
    Golden {
        name: "fence_lease",
        at_ms: 1700000000011,
        idempotency_key: None,
        json: r#"{"fence_lease":{"fence":{"profile":3,"lease":7,"generation":2},"reason":"operator"}}"#,
        log_hex: "01fd0000018bcfe5680b000b03070202",
        fingerprint: "c2511dcdfc3e7a4b4c2b84b7921ab5b2636d9e0e846e5ffb25b6136151f93d30",
    },
    Golden {
        name: "record_reap_evidence",
        at_ms: 1700000000012,
        idempotency_key: Some("key-12"),
        json: r#"{"record_reap_evidence":{"profile":3,"evidence":{"lease":7,"generation":2,"cgroup":"squadron/acme/web/leaf","populated":false,"observed_at_ms":123456,"source":"cgroup_events"}}}"#,
        log_hex: "01fd0000018bcfe5680c01066b65792d31320c030702167371756164726f6e2f61636d652f7765622f6c65616600fc0001e24000",
        fingerprint: "05143c335522cd34b5273dd1e708a06e4f311b7dcdabe3fbac3478121d96bb50",
    },
    Golden {
        name: "graceful_takeover",
        at_ms: 1700000000013,
        idempotency_key: None,
        json: r#"{"graceful_takeover":{"fence":{"profile":3,"lease":7,"generation":2},"capsule":{"sequence":4,"previous":"abababababababababababababababababababababababababababababababab","schema_version":1,"payload":{"task_state":"halfway","decisions":["keep the api"],"pending_work":["tests","docs"],"repository_revision":"abc1234","mailbox_cursor":9,"context_ref":"ctx-1"},"expected_digest":null},"next":{"provider":"claude","holder":{"worker":"w1","process":"pid 4242 on host-a","cgroup":"squadron/acme/web/leaf"},"ttl_ms":30000},"old_reap_evidence":{"lease":7,"generation":2,"cgroup":"squadron/acme/web/leaf","populated":false,"observed_at_ms":123456,"source":"cgroup_events"}}}"#,
        log_hex: "01fd0000018bcfe5680d000d03070204014061626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162010768616c66776179010c6b65657020746865206170690205746573747304646f6373076162633132333409056374782d310001027731127069642034323432206f6e20686f73742d6101167371756164726f6e2f61636d652f7765622f6c656166fb7530010702167371756164726f6e2f61636d652f7765622f6c65616600fc0001e24000",
        fingerprint: "2a7fc134bda7d55d64dbdf4b8176ce6a71c44e3913dde4312345d0da4ef4957d",
    },
    Golden {
        name: "crash_takeover",
        at_ms: 1700000000014,
        idempotency_key: Some("key-14"),
        json: r#"{"crash_takeover":{"profile":3,"lease":7,"generation":2,"next":{"provider":"claude","holder":{"worker":"w1","process":"pid 4242 on host-a","cgroup":"squadron/acme/web/leaf"},"ttl_ms":30000},"reap_evidence":{"lease":7,"generation":2,"cgroup":"squadron/acme/web/leaf","populated":false,"observed_at_ms":123456,"source":{"operator_decommission":{"operator":"ops","reason":"host gone"}}}}}"#,
        log_hex: "01fd0000018bcfe5680e01066b65792d31340e03070201027731127069642034323432206f6e20686f73742d6101167371756164726f6e2f61636d652f7765622f6c656166fb7530010702167371756164726f6e2f61636d652f7765622f6c65616600fc0001e24001036f707309686f737420676f6e65",
        fingerprint: "4c593398d963079fa1e1cb420e3b8094302d1f57b676744dd1eaecebb4fa87ff",
    },
    Golden {
        name: "commit_capsule",
        at_ms: 1700000000015,
        idempotency_key: None,
        json: r#"{"commit_capsule":{"fence":{"profile":3,"lease":7,"generation":2},"capsule":{"sequence":4,"previous":null,"schema_version":1,"payload":{"task_state":"halfway","decisions":["keep the api"],"pending_work":["tests","docs"],"repository_revision":"abc1234","mailbox_cursor":9,"context_ref":"ctx-1"},"expected_digest":"1111111111111111111111111111111111111111111111111111111111111111"}}}"#,
        log_hex: "01fd0000018bcfe5680f000f0307020400010768616c66776179010c6b65657020746865206170690205746573747304646f6373076162633132333409056374782d31014031313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131313131",
        fingerprint: "b5cb5a9dffd1ded5e186723d5740c928723d02baaeaa28100a36e6f84770fbd4",
    },
    Golden {
        name: "post_message",
        at_ms: 1700000000016,
        idempotency_key: Some("key-16"),
        json: r#"{"post_message":{"to":4,"sender":{"profile":{"profile":3,"lease":7,"generation":2}},"kind":"handoff","body":"over to you"}}"#,
        log_hex: "01fd0000018bcfe5681001066b65792d3136100400030702000b6f76657220746f20796f75",
        fingerprint: "8705094c6680ab21975a6a7003bc250b0f3446e75d5fb8773d5c3207aa97cb5d",
    },
    Golden {
        name: "ack_messages",
        at_ms: 1700000000017,
        idempotency_key: None,
        json: r#"{"ack_messages":{"fence":{"profile":3,"lease":7,"generation":2},"through_seq":12}}"#,
        log_hex: "01fd0000018bcfe5681100110307020c",
        fingerprint: "e671330964481b1c7aa7bcff2b48b325b88770d984f502067b2af7729dcef15b",
    },
    Golden {
        name: "submit_task",
        at_ms: 1700000000018,
        idempotency_key: Some("key-18"),
        json: r#"{"submit_task":{"spec":{"name":"Pin the encodings","labels":{"priority":"high","team":"platform"},"priority":"high","repository":{"url":"https://github.com/org/repo","branch":"main","commit":"abc1234","subpath":"packages/auth"},"agent":{"prompt":"Refactor the module.","model":"claude-sonnet-4-5","max_turns":100,"allowed_tools":["Read","Write"],"provider":"claude","script":null},"sandbox":{"profile":"agentic-dev","cpus":4,"memory_bytes":8589934592,"disk_bytes":42949672960,"network_mode":"isolated","runtime":"docker","full_control":true},"placement":{"project":{"tenant":"acme","project":"web","profile":"reviewer"}},"startup_profile":{"id":"startup-a","trigger":"on_instance_ready","session":{"launcher":"agentic-claude-automation","workdir":"/workspace","cols":120,"rows":30},"credential_refs":[{"id":"cred_a","mount":"key_a"}],"readiness":{"probes":[{"provider":"claude","kind":"auth"}]},"observation":{"retention_class":"short","redaction_profile":"secrets-v1"}},"lifecycle":{"timeout_ms":7200000,"stage_timeout_ms":600000,"provision_timeout_ms":300000,"hang_timeout_ms":900000,"cancel_grace_ms":20000,"failure_action":"preserve","artifact_patterns":["*.patch","reports/*.json"],"success_exit_codes":[0,3],"retries":{"clone":{"max":2,"backoff_ms":[1000,5000]},"provision":{"max":1,"backoff_ms":[10000]},"agent_connect":{"max":4,"backoff_ms":[2000]}}}}}}"#,
        log_hex: "01fd0000018bcfe5681201066b65792d3138121150696e2074686520656e636f64696e677302087072696f726974790468696768047465616d08706c6174666f726d021b68747470733a2f2f6769746875622e636f6d2f6f72672f7265706f01046d61696e010761626331323334010d7061636b616765732f61757468145265666163746f7220746865206d6f64756c652e0111636c617564652d736f6e6e65742d342d350164010204526561640557726974650100010b6167656e7469632d646576010401fd000000020000000001fd0000000a00000000000101010461636d65037765620872657669657765720109737461727475702d6100196167656e7469632d636c617564652d6175746f6d6174696f6e0a2f776f726b7370616365781e0106637265645f61056b65795f610106636c6175646504617574680573686f72740a736563726574732d7631fc006ddd00fc000927c0fc000493e0fc000dbba0fb4e200102072a2e70617463680e7265706f7274732f2a2e6a736f6e0200060202fb03e8fb13880101fb27100401fb07d0",
        fingerprint: "70ff050256f66c8856afee3fdb64a3acd18cfd78741a1dabdbb01f35fd8a2317",
    },
    Golden {
        name: "assign_tasks",
        at_ms: 1700000000019,
        idempotency_key: None,
        json: r#"{"assign_tasks":{"assignments":[{"task":5,"worker":"w1"},{"task":6,"worker":"w2"}]}}"#,
        log_hex: "01fd0000018bcfe568130013020502773106027732",
        fingerprint: "f230a37686f92adaae01fcd23a7142e932550f76a4abaee91fc21ca456682ab7",
    },
    Golden {
        name: "report_transition",
        at_ms: 1700000000020,
        idempotency_key: Some("key-20"),
        json: r#"{"report_transition":{"task":5,"worker":"w1","attempt":1,"from":"RUNNING","to":"COMPLETING","detail":{"exit_code":0,"error":"none","artifacts":["out.patch"]}}}"#,
        log_hex: "01fd0000018bcfe5681401066b65792d32301405027731010405010001046e6f6e6501096f75742e7061746368",
        fingerprint: "73a1469e0fcb9cab7eba32503a1ce157a6457cff79667d03ab1c02db86ad4abd",
    },
    Golden {
        name: "report_progress",
        at_ms: 1700000000021,
        idempotency_key: None,
        json: r#"{"report_progress":{"task":5,"worker":"w1","attempt":1,"stdout_bytes":1024,"stderr_bytes":12,"lines":40,"events":3}}"#,
        log_hex: "01fd0000018bcfe5681500150502773101fb04000c2803",
        fingerprint: "ccc8a85bcab22e3b6c60582336475c046fba091cb340343fd924f6744a31ceef",
    },
    Golden {
        name: "cancel_task",
        at_ms: 1700000000022,
        idempotency_key: Some("key-22"),
        json: r#"{"cancel_task":{"task":5,"reason":"superseded"}}"#,
        log_hex: "01fd0000018bcfe5681601066b65792d323216050a73757065727365646564",
        fingerprint: "debcc357cb81961d6cca27e2731d6409ae09a83249372e3aa186e2f532359d62",
    },
    Golden {
        name: "register_worker",
        at_ms: 1700000000023,
        idempotency_key: None,
        json: r#"{"register_worker":{"worker":"w1","address":"10.0.0.5:9000","runtimes":["process","kvm"],"capacity":4,"labels":{"zone":"a"},"heartbeat_interval_ms":5000}}"#,
        log_hex: "01fd0000018bcfe5681700170277310d31302e302e302e353a393030300200020401047a6f6e650161fb1388",
        fingerprint: "29b0df47c85e5fd32c363a8815cf1efe37f7335e6b87d3b7b5036fb463c0268e",
    },
    Golden {
        name: "worker_heartbeat",
        at_ms: 1700000000024,
        idempotency_key: Some("key-24"),
        json: r#"{"worker_heartbeat":{"worker":"w1"}}"#,
        log_hex: "01fd0000018bcfe5681801066b65792d323418027731",
        fingerprint: "85b5381a4659da4c6e22df5b25fb42c3e6d70c9a9194fa8979bfd91b313b9959",
    },
    Golden {
        name: "decommission_worker",
        at_ms: 1700000000025,
        idempotency_key: None,
        json: r#"{"decommission_worker":{"worker":"w2","operator":"ops","reason":"host gone"}}"#,
        log_hex: "01fd0000018bcfe568190019027732036f707309686f737420676f6e65",
        fingerprint: "1d9a74ae4d7e564f61ae6d0585e5db878379c3f9c99a9691cafb8e1878651951",
    },
    Golden {
        name: "sweep",
        at_ms: 1700000000026,
        idempotency_key: Some("key-26"),
        json: r#""sweep""#,
        log_hex: "01fd0000018bcfe5681a01066b65792d32361a",
        fingerprint: "2986113d3bc27183978188edd7e72c3352c5cd6c8f2de6b65a466fc15bc2b49e",
    },
    Golden {
        name: "batch",
        at_ms: 1700000000027,
        idempotency_key: None,
        json: r#"{"batch":{"commands":[{"idempotency_key":"k-1","command":{"worker_heartbeat":{"worker":"w1"}}},{"idempotency_key":null,"command":{"cancel_task":{"task":6,"reason":"dup"}}}]}}"#,
        log_hex: "01fd0000018bcfe5681b001b0201036b2d311802773100160603647570",
        fingerprint: "75e026def7d68404405edbb5978566083a487f813599e0c54e35c2b43e1127d6",
    },
];

/// Every variant of `Command`, by `Command::name()`, in declaration order.
const VARIANTS: &[&str] = &[
    "create_project",
    "attach_sandbox",
    "detach_sandbox",
    "create_profile",
    "set_capability_manifest",
    "grant_mcp_use",
    "revoke_mcp_use",
    "acquire_lease",
    "renew_lease",
    "renew_leases",
    "release_lease",
    "fence_lease",
    "record_reap_evidence",
    "graceful_takeover",
    "crash_takeover",
    "commit_capsule",
    "post_message",
    "ack_messages",
    "submit_task",
    "assign_tasks",
    "report_transition",
    "report_progress",
    "cancel_task",
    "register_worker",
    "worker_heartbeat",
    "decommission_worker",
    "sweep",
    "batch",
    "create_operator_token",
    "revoke_operator_token",
    "mint_bootstrap_token",
    "enroll",
    "record_certificate",
    "revoke_identity",
    "put_credential",
    "rotate_credential",
    "revoke_credential",
    "grant_credential_lease",
    "set_worker_policy",
    "request_agent_operation",
    "agent_check_in",
    "assign_project_tasks",
    "set_profile_credentials",
    "grant_agent_credential_lease",
    "set_credential_egress",
    "register_worker_with_policy",
    "leader_sweep",
    "prune_tasks",
    "report_progress_v2",
    "regrant_agent_credential_lease",
    "regrant_credential_lease",
];

/// The declaration index of each variant: an exhaustive match, so a variant added to `Command`
/// does not compile here until it has a golden (and its place in `VARIANTS`).
fn variant_index(command: &Command) -> usize {
    use Command as C;
    match command {
        C::CreateProject(_) => 0,
        C::AttachSandbox(_) => 1,
        C::DetachSandbox(_) => 2,
        C::CreateProfile(_) => 3,
        C::SetCapabilityManifest(_) => 4,
        C::GrantMcpUse(_) => 5,
        C::RevokeMcpUse(_) => 6,
        C::AcquireLease(_) => 7,
        C::RenewLease(_) => 8,
        C::RenewLeases(_) => 9,
        C::ReleaseLease(_) => 10,
        C::FenceLease(_) => 11,
        C::RecordReapEvidence(_) => 12,
        C::GracefulTakeover(_) => 13,
        C::CrashTakeover(_) => 14,
        C::CommitCapsule(_) => 15,
        C::PostMessage(_) => 16,
        C::AckMessages(_) => 17,
        C::SubmitTask(_) => 18,
        C::AssignTasks(_) => 19,
        C::ReportTransition(_) => 20,
        C::ReportProgress(_) => 21,
        C::CancelTask(_) => 22,
        C::RegisterWorker(_) => 23,
        C::WorkerHeartbeat(_) => 24,
        C::DecommissionWorker(_) => 25,
        C::Sweep => 26,
        C::Batch(_) => 27,
        C::CreateOperatorToken(_) => 28,
        C::RevokeOperatorToken(_) => 29,
        C::MintBootstrapToken(_) => 30,
        C::Enroll(_) => 31,
        C::RecordCertificate(_) => 32,
        C::RevokeIdentity(_) => 33,
        C::PutCredential(_) => 34,
        C::RotateCredential(_) => 35,
        C::RevokeCredential(_) => 36,
        C::GrantCredentialLease(_) => 37,
        C::SetWorkerPolicy(_) => 38,
        C::RequestAgentOperation(_) => 39,
        C::AgentCheckIn(_) => 40,
        C::AssignProjectTasks(_) => 41,
        C::SetProfileCredentials(_) => 42,
        C::GrantAgentCredentialLease(_) => 43,
        C::SetCredentialEgress(_) => 44,
        C::RegisterWorkerWithPolicy(_) => 45,
        C::LeaderSweep(_) => 46,
        C::PruneTasks(_) => 47,
        C::ReportProgressV2(_) => 48,
        C::RegrantAgentCredentialLease(_) => 49,
        C::RegrantCredentialLease(_) => 50,
    }
}

fn new_command(json: &str) -> Command {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("new golden does not decode: {e}"))
}

fn new_envelope(json: &str) -> CommandEnvelope {
    CommandEnvelope {
        at_ms: 1700000000100,
        idempotency_key: None,
        subject: operator(),
        command: new_command(json),
    }
}

#[test]
fn new_commands_are_pinned_in_json_and_log_encoding() {
    for (name, json, hex_v2) in NEW_GOLDENS {
        let command = new_command(json);
        assert_eq!(command.name(), *name);
        assert_eq!(
            serde_json::to_string(&command).expect("json"),
            *json,
            "{name}: JSON"
        );
        let envelope = new_envelope(json);
        let bytes = encode_command(&envelope);
        assert_eq!(hex::encode(&bytes), *hex_v2, "{name}: log encoding changed");
        assert_eq!(decode_command(&bytes).expect("decodes"), envelope);
    }
}

fn command(golden: &Golden) -> Command {
    serde_json::from_str(golden.json)
        .unwrap_or_else(|e| panic!("{}: the JSON golden no longer decodes: {e}", golden.name))
}

fn envelope(golden: &Golden, subject: Subject) -> CommandEnvelope {
    CommandEnvelope {
        at_ms: golden.at_ms,
        idempotency_key: golden
            .idempotency_key
            .map(|k| IdempotencyKey::new(k).expect("golden key")),
        subject,
        command: command(golden),
    }
}

/// The subject of the version-2 goldens: an operator's token.
fn operator() -> Subject {
    Subject::Operator(TokenId::new("00112233aabbccdd").expect("token id"))
}

#[test]
fn the_goldens_cover_every_command_variant() {
    let mut names: Vec<&str> = GOLDENS.iter().map(|g| command(g).name()).collect();
    names.extend(
        NEW_GOLDENS
            .iter()
            .map(|(_, json, _)| new_command(json).name()),
    );
    assert_eq!(names, VARIANTS);
    let mut commands: Vec<Command> = GOLDENS.iter().map(command).collect();
    commands.extend(NEW_GOLDENS.iter().map(|(_, json, _)| new_command(json)));
    let indexes: Vec<usize> = commands.iter().map(variant_index).collect();
    assert_eq!(indexes, (0..VARIANTS.len()).collect::<Vec<_>>());
    let mut labelled: Vec<&str> = GOLDENS.iter().map(|g| g.name).collect();
    labelled.extend(NEW_GOLDENS.iter().map(|(name, _, _)| *name));
    assert_eq!(labelled, VARIANTS);
    let batch: serde_json::Value =
        serde_json::from_str(GOLDENS.last().expect("goldens").json).expect("batch JSON");
    let held = batch["batch"]["commands"].as_array().map(Vec::len);
    assert_eq!(held, Some(2), "the last golden is a batch holding two");
}

#[test]
fn json_encoding_is_unchanged() {
    for golden in GOLDENS {
        let json = serde_json::to_string(&command(golden)).expect("encode");
        if golden.name == "batch" {
            // Batched commands gained a subject (a batch never travels as JSON: it is made by
            // the leader's batcher). The old form still decodes, as legacy commands.
            assert_eq!(
                json,
                golden
                    .json
                    .replace(r#""command":"#, r#""subject":"legacy","command":"#),
                "batch: JSON encoding changed"
            );
            continue;
        }
        assert_eq!(json, golden.json, "{}: JSON encoding changed", golden.name);
    }
}

#[test]
fn version_1_log_entries_still_decode_as_legacy_commands() {
    for golden in GOLDENS {
        let expected = hex::decode(golden.log_hex).expect("golden hex");
        let decoded = decode_command(&expected)
            .unwrap_or_else(|e| panic!("{}: the log golden no longer decodes: {e}", golden.name));
        assert_eq!(
            decoded,
            envelope(golden, Subject::Legacy),
            "{}: log decoding changed",
            golden.name
        );
    }
}

#[test]
fn version_2_log_encoding_is_pinned_and_round_trips() {
    assert_eq!(V2_LOG_GOLDENS.len(), GOLDENS.len());
    for (golden, (name, hex_v2)) in GOLDENS.iter().zip(V2_LOG_GOLDENS) {
        assert_eq!(golden.name, *name);
        let envelope = envelope(golden, operator());
        let bytes = encode_command(&envelope);
        assert_eq!(hex::encode(&bytes), *hex_v2, "{name}: log encoding changed");
        assert_eq!(bytes[0], 2, "{name}: version byte");
        assert_eq!(decode_command(&bytes).expect("decodes"), envelope);
    }
}

#[test]
fn command_fingerprints_are_unchanged() {
    for golden in GOLDENS {
        if golden.name == "batch" {
            // Batched commands gained subjects; a batch cannot carry a key, so no ledger ever
            // recorded its fingerprint.
            continue;
        }
        let fingerprint = command_fingerprint(&Subject::Legacy, &command(golden)).to_string();
        assert_eq!(
            fingerprint, golden.fingerprint,
            "{}: fingerprint changed",
            golden.name
        );
        // Another subject binds the key to itself: the same command from someone else does
        // not replay the first answer.
        assert_ne!(
            command_fingerprint(&operator(), &command(golden)).to_string(),
            golden.fingerprint
        );
    }
}

/// The command variants never refused unknown fields (only the nested types that say so, like
/// `NextHolder`, do); a forwarded proposal from a node that knows one more field still decodes.
#[test]
fn unknown_fields_of_a_command_are_ignored_as_before() {
    let with_extra = r#"{"renew_lease":{"fence":{"profile":3,"lease":7,"generation":2},"ttl_ms":10000,"extra":1}}"#;
    let plain = GOLDENS
        .iter()
        .find(|g| g.name == "renew_lease")
        .expect("renew_lease golden");
    let decoded: Command = serde_json::from_str(with_extra).expect("decodes");
    assert_eq!(decoded, command(plain));
    let nested_extra = r#"{"acquire_lease":{"profile":3,"expected_generation":1,"provider":"codex","holder":{"worker":"w1","process":"p","cgroup":null,"extra":1},"ttl_ms":10000}}"#;
    let refused = serde_json::from_str::<Command>(nested_extra).expect_err("holder denies");
    assert!(
        refused.to_string().contains("unknown field `extra`"),
        "{refused}"
    );
}
