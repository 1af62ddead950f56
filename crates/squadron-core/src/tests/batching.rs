//! `Command::Batch`: one log entry carrying many writes must answer and change the state
//! exactly as those writes would have as entries of their own (INV-11, INV-12).

use super::*;
use crate::access::Subject;
use crate::command::BatchedCommand;
use crate::limits::COMMANDS_PER_BATCH_MAX;
use crate::snapshot::state_digest;

fn batch_of(at_ms: u64, envelopes: &[CommandEnvelope]) -> CommandEnvelope {
    CommandEnvelope {
        subject: Subject::Legacy,
        at_ms,
        idempotency_key: None,
        command: Command::Batch(Batch {
            commands: envelopes
                .iter()
                .map(|e| BatchedCommand {
                    subject: Subject::Legacy,
                    idempotency_key: e.idempotency_key.clone(),
                    command: e.command.clone(),
                })
                .collect(),
        }),
    }
}

fn responses(r: Response) -> Vec<Response> {
    match r {
        Response::Ok(Outcome::Batch { responses }) => responses,
        other => panic!("a batch answered {other:?}"),
    }
}

#[test]
fn inv_12_a_batch_answers_and_changes_the_state_as_its_commands_one_by_one() {
    // The same commands, all at one time (a batch has one leader stamp).
    let at = 50;
    let envelopes: Vec<CommandEnvelope> = super::determinism::commands()
        .into_iter()
        .map(|e| CommandEnvelope { at_ms: at, ..e })
        .collect();
    let mut single = State::new();
    let one_by_one: Vec<Response> = envelopes.iter().map(|e| single.apply(e.clone())).collect();
    let mut batched = State::new();
    let answers = responses(batched.apply(batch_of(at, &envelopes)));
    assert_eq!(answers, one_by_one);
    assert_eq!(state_digest(&batched), state_digest(&single));
    assert!(
        one_by_one.iter().any(|r| !r.is_ok()),
        "the sequence includes a rejection, so rejections are compared too"
    );
}

#[test]
fn inv_11_keys_inside_a_batch_are_honoured_per_command() {
    let key = IdempotencyKey::new("k-1").unwrap();
    let register = |address: &str| CommandEnvelope {
        subject: Subject::Legacy,
        at_ms: 1,
        idempotency_key: Some(key.clone()),
        command: Command::RegisterWorker(RegisterWorker {
            worker: worker(),
            address: address.into(),
            runtimes: vec![RuntimeKind::Process],
            capacity: 4,
            labels: BTreeMap::new(),
            heartbeat_interval_ms: 1_000,
        }),
    };
    let mut s = State::new();
    let answers = responses(s.apply(batch_of(
        1,
        &[register("a:1"), register("a:1"), register("b:2")],
    )));
    assert!(answers[0].is_ok());
    assert_eq!(
        answers[1], answers[0],
        "a retry inside the batch is a replay"
    );
    assert_eq!(
        answers[2],
        Response::Rejected(Rejection::IdempotencyKeyReused),
        "the key with another command is refused"
    );
    assert_eq!(s.worker(&worker()).unwrap().address, "a:1");
    // And across entries: the key recorded inside the batch replays later.
    assert_eq!(s.apply(register("a:1")), answers[0]);
}

#[test]
fn bad_batches_are_refused_and_change_nothing() {
    let heartbeat = CommandEnvelope {
        subject: Subject::Legacy,
        at_ms: 1,
        idempotency_key: None,
        command: Command::WorkerHeartbeat(WorkerHeartbeat { worker: worker() }),
    };
    let mut s = State::new();
    let before = state_digest(&s);

    let mut keyed = batch_of(1, std::slice::from_ref(&heartbeat));
    keyed.idempotency_key = Some(IdempotencyKey::new("outer").unwrap());
    match s.apply(keyed) {
        Response::Rejected(Rejection::Invalid(v)) => assert_eq!(v.field, "idempotency_key"),
        other => panic!("{other:?}"),
    }
    let too_many = vec![heartbeat.clone(); COMMANDS_PER_BATCH_MAX + 1];
    match s.apply(batch_of(1, &too_many)) {
        Response::Rejected(Rejection::Invalid(v)) => assert_eq!(v.field, "commands"),
        other => panic!("{other:?}"),
    }
    // Only the clock moved (it moves with every entry).
    let mut clock_only = State::new();
    clock_only.apply(CommandEnvelope {
        subject: Subject::Legacy,
        at_ms: 1,
        idempotency_key: None,
        command: Command::Batch(Batch { commands: vec![] }),
    });
    assert_eq!(state_digest(&s), state_digest(&clock_only));
    assert_ne!(before, state_digest(&clock_only));

    // A nested batch is refused by itself; its neighbours apply.
    let nested = CommandEnvelope {
        subject: Subject::Legacy,
        at_ms: 2,
        idempotency_key: None,
        command: Command::Batch(Batch { commands: vec![] }),
    };
    let register = CommandEnvelope {
        subject: Subject::Legacy,
        at_ms: 2,
        idempotency_key: None,
        command: Command::RegisterWorker(RegisterWorker {
            worker: worker(),
            address: "a:1".into(),
            runtimes: vec![RuntimeKind::Process],
            capacity: 4,
            labels: BTreeMap::new(),
            heartbeat_interval_ms: 1_000,
        }),
    };
    let answers = responses(s.apply(batch_of(2, &[nested, register])));
    match &answers[0] {
        Response::Rejected(Rejection::Invalid(v)) => assert_eq!(v.field, "command"),
        other => panic!("{other:?}"),
    }
    assert!(answers[1].is_ok());
}
