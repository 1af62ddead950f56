//! Builds histories by hand: each call appends one event at the given time.

use serde_json::{json, Value};

use crate::event::{Event, EventType, Process};
use crate::history::History;

#[derive(Debug, Default)]
pub struct Builder {
    events: Vec<Event>,
}

impl Builder {
    pub fn new() -> Self {
        Self::default()
    }

    fn push(
        &mut self,
        t: f64,
        p: u64,
        kind: EventType,
        f: &str,
        key: &str,
        value: Value,
    ) -> &mut Self {
        let index = self.events.len() as u64;
        self.events.push(Event {
            index,
            time_ms: t,
            process: Process::Client(p),
            kind,
            f: f.into(),
            key: Some(key.into()),
            value,
        });
        self
    }

    pub fn invoke(&mut self, t: f64, p: u64, f: &str, key: &str, value: Value) -> &mut Self {
        self.push(t, p, EventType::Invoke, f, key, value)
    }

    pub fn ok(&mut self, t: f64, p: u64, f: &str, key: &str, value: Value) -> &mut Self {
        self.push(t, p, EventType::Ok, f, key, value)
    }

    pub fn fail(&mut self, t: f64, p: u64, f: &str, key: &str, value: Value) -> &mut Self {
        self.push(t, p, EventType::Fail, f, key, value)
    }

    pub fn info(&mut self, t: f64, p: u64, f: &str, key: &str) -> &mut Self {
        self.push(t, p, EventType::Info, f, key, json!({"error": "timeout"}))
    }

    pub fn nemesis(&mut self, t: f64, f: &str, fault: &str) -> &mut Self {
        self.nemesis_with(t, f, fault, Value::Null)
    }

    /// A nemesis event with the details the nemesis recorded.
    pub fn nemesis_with(&mut self, t: f64, f: &str, fault: &str, detail: Value) -> &mut Self {
        let index = self.events.len() as u64;
        self.events.push(Event {
            index,
            time_ms: t,
            process: Process::NEMESIS,
            kind: EventType::Info,
            f: f.into(),
            key: None,
            value: if detail.is_null() {
                json!({"fault": fault})
            } else {
                json!({"fault": fault, "detail": detail})
            },
        });
        self
    }

    /// On a takeover key: a launch granted generation 1 (lease 3), then a graceful takeover
    /// granted 2, over t = 0..3.
    pub fn launch_then_take_over(&mut self, key: &str) -> &mut Self {
        self.invoke(0.0, 1, "launch", key, Value::Null)
            .ok(1.0, 1, "launch", key, json!({"generation": 1, "lease": 3}))
            .invoke(2.0, 1, "takeover", key, json!({"kind": "graceful"}))
            .ok(
                3.0,
                1,
                "takeover",
                key,
                json!({"generation": 2, "replaced": 1}),
            )
    }

    /// A complete keyed CAS on `key` (the `keyed` workload), sent `attempts` times.
    pub fn keyed_cas(
        &mut self,
        t0: f64,
        p: u64,
        key: &str,
        idem: &str,
        version: u64,
        attempts: u64,
    ) -> &mut Self {
        let input = json!({"expected": version - 1, "value": 7, "idempotency_key": idem});
        self.invoke(t0, p, "cas", key, input).ok(
            t0 + 1.0,
            p,
            "cas",
            key,
            json!({"version": version, "attempts": attempts}),
        )
    }

    /// A complete replay of the keyed write `idem`, first answered `first`, now `again`.
    pub fn replay(
        &mut self,
        t0: f64,
        p: u64,
        key: &str,
        idem: &str,
        first: Value,
        again: Value,
    ) -> &mut Self {
        let input = json!({"idempotency_key": idem, "answer": first});
        self.invoke(t0, p, "replay", key, input).ok(
            t0 + 1.0,
            p,
            "replay",
            key,
            json!({"answer": again}),
        )
    }

    /// A complete task report `from` → `to` on `tasks/1`, answered `out` (a refusal when it
    /// names an error).
    pub fn transition(&mut self, t: f64, p: u64, from: &str, to: &str, out: Value) -> &mut Self {
        self.invoke(
            t,
            p,
            "transition",
            "tasks/1",
            json!({"from": from, "to": to}),
        );
        if out.get("error").is_some() {
            self.fail(t + 0.5, p, "transition", "tasks/1", out)
        } else {
            self.ok(t + 0.5, p, "transition", "tasks/1", out)
        }
    }

    /// A complete read of `tasks/1` answering `state`.
    pub fn read_task(&mut self, t: f64, p: u64, state: &str, input: Value) -> &mut Self {
        self.invoke(t, p, "read", "tasks/1", input).ok(
            t + 0.5,
            p,
            "read",
            "tasks/1",
            json!({"state": state}),
        )
    }

    /// A complete acquire.
    pub fn acquire(
        &mut self,
        t0: f64,
        t1: f64,
        p: u64,
        key: &str,
        expected: u64,
        granted: u64,
    ) -> &mut Self {
        self.invoke(t0, p, "acquire", key, json!({"expected": expected}))
            .ok(
                t1,
                p,
                "acquire",
                key,
                json!({"generation": granted, "lease": granted * 100}),
            )
    }

    /// A complete release.
    pub fn release(&mut self, t0: f64, t1: f64, p: u64, key: &str, generation: u64) -> &mut Self {
        self.invoke(
            t0,
            p,
            "release",
            key,
            json!({"generation": generation, "lease": generation * 100}),
        )
        .ok(t1, p, "release", key, Value::Null)
    }

    /// A complete lease-register read.
    pub fn read_lease(
        &mut self,
        t0: f64,
        t1: f64,
        p: u64,
        key: &str,
        generation: u64,
        live: bool,
    ) -> &mut Self {
        self.invoke(t0, p, "read", key, Value::Null).ok(
            t1,
            p,
            "read",
            key,
            json!({"generation": generation, "live": live}),
        )
    }

    /// The quiet phase's final read of a lease key.
    pub fn final_lease(
        &mut self,
        t: f64,
        p: u64,
        key: &str,
        generation: u64,
        live: bool,
    ) -> &mut Self {
        self.invoke(t, p, "read", key, json!({"final": true})).ok(
            t + 0.5,
            p,
            "read",
            key,
            json!({"generation": generation, "live": live}),
        )
    }

    pub fn build(&self) -> History {
        History::new(self.events.clone())
    }
}
