//! proptest strategies for universes and operation sequences.

use crate::*;

pub(crate) fn any_p() -> impl Strategy<Value = usize> {
    0usize..6
}

pub(crate) fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        14 => Just(Tok::Current),
        2 => Just(Tok::Own),
        2 => Just(Tok::StaleGen),
        2 => (0usize..32).prop_map(Tok::OtherLease),
        1 => (0usize..6).prop_map(Tok::WrongProfile),
    ]
}

pub(crate) fn ttl() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 1_000u64..=5_000, 1 => Just(999u64)]
}

pub(crate) fn provider() -> impl Strategy<Value = Provider> {
    prop_oneof![
        10 => Just(Provider::Codex),
        8 => Just(Provider::Claude),
        1 => Just(Provider::Script),
    ]
}

pub(crate) fn next() -> impl Strategy<Value = Next> {
    (
        provider(),
        prop::bool::weighted(0.92),
        prop::bool::weighted(0.8),
        ttl(),
    )
        .prop_map(|(provider, worker_ok, cgroup, ttl)| Next {
            provider,
            worker_ok,
            cgroup,
            ttl,
        })
}

pub(crate) fn ev() -> impl Strategy<Value = Ev> {
    (
        prop::bool::weighted(0.12),
        prop::bool::weighted(0.88),
        prop::bool::weighted(0.88),
        prop::bool::weighted(0.92),
        prop::bool::weighted(0.95),
    )
        .prop_map(
            |(populated, gen_ok, cgroup_ok, observed_ok, source_ok)| Ev {
                populated,
                gen_ok,
                cgroup_ok,
                observed_ok,
                source_ok,
            },
        )
}

pub(crate) fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        10 => Just(Target::Stuck),
        6 => Just(Target::Latest),
        3 => (0usize..32).prop_map(Target::Nth),
        1 => Just(Target::Missing),
    ]
}

pub(crate) fn chain() -> impl Strategy<Value = Chain> {
    prop_oneof![
        16 => Just(Chain::Right),
        1 => Just(Chain::SeqAhead),
        1 => Just(Chain::SeqRepeat),
        1 => Just(Chain::WrongPrev),
        1 => Just(Chain::Zero),
    ]
}

pub(crate) fn verify() -> impl Strategy<Value = Verify> {
    prop_oneof![
        6 => Just(Verify::Unset),
        4 => Just(Verify::Right),
        1 => Just(Verify::Wrong),
    ]
}

pub(crate) fn to() -> impl Strategy<Value = To> {
    prop_oneof![
        14 => Just(To::Forward),
        2 => Just(To::Fail),
        2 => Just(To::FailPreserved),
        2 => Just(To::Cancel),
        2 => (0usize..10).prop_map(To::Any),
    ]
}

pub(crate) fn op(mix: Mix) -> BoxedStrategy<Op> {
    let arms: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (mix.acquire, acquire_op()),
        (mix.renew, renew_op()),
        (mix.release, release_op()),
        (mix.fence, fence_op()),
        (mix.reap, reap_op()),
        (mix.graceful, graceful_op()),
        (mix.crash, crash_op()),
        (mix.commit, commit_op()),
        (mix.sweep, Just(Op::Sweep).boxed()),
        (
            mix.submit,
            (0usize..8).prop_map(|spec| Op::Submit { spec }).boxed(),
        ),
        (mix.assign, assign_op()),
        (mix.report, report_op()),
        (
            mix.cancel,
            (0usize..16).prop_map(|t| Op::Cancel { t }).boxed(),
        ),
        (mix.check_in, check_in_op()),
    ];
    Union::new_weighted(arms.into_iter().filter(|(w, _)| *w > 0).collect()).boxed()
}

fn check_in_op() -> BoxedStrategy<Op> {
    (
        0usize..16,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.9),
        any::<bool>(),
    )
        .prop_map(|(t, raw, attempt_ok, usage)| Op::CheckIn {
            t,
            raw,
            attempt_ok,
            usage,
        })
        .boxed()
}

fn acquire_op() -> BoxedStrategy<Op> {
    (
        any_p(),
        prop::bool::weighted(0.75),
        prop_oneof![8 => Just(Gen::Right), 1 => Just(Gen::Behind), 1 => Just(Gen::Ahead)],
        next(),
    )
        .prop_map(|(p, idle, gen, next)| Op::Acquire { p, idle, gen, next })
        .boxed()
}

fn renew_op() -> BoxedStrategy<Op> {
    (any_p(), tok(), ttl())
        .prop_map(|(p, tok, ttl)| Op::Renew { p, tok, ttl })
        .boxed()
}

fn release_op() -> BoxedStrategy<Op> {
    (any_p(), tok())
        .prop_map(|(p, tok)| Op::Release { p, tok })
        .boxed()
}

fn fence_op() -> BoxedStrategy<Op> {
    (
        any_p(),
        tok(),
        prop_oneof![
            5 => Just(FenceReason::Operator),
            4 => Just(FenceReason::Expired),
            1 => Just(FenceReason::Takeover),
        ],
    )
        .prop_map(|(p, tok, reason)| Op::Fence { p, tok, reason })
        .boxed()
}

fn reap_op() -> BoxedStrategy<Op> {
    (any_p(), target(), ev())
        .prop_map(|(p, target, ev)| Op::Reap { p, target, ev })
        .boxed()
}

fn graceful_op() -> BoxedStrategy<Op> {
    (
        any_p(),
        tok(),
        chain(),
        verify(),
        any::<u8>(),
        prop::option::weighted(0.5, ev()),
        next(),
    )
        .prop_map(|(p, tok, chain, verify, seed, ev, next)| Op::Graceful {
            p,
            tok,
            chain,
            verify,
            seed,
            ev,
            next,
        })
        .boxed()
}

fn crash_op() -> BoxedStrategy<Op> {
    (
        any_p(),
        target(),
        prop::bool::weighted(0.9),
        prop::option::weighted(0.75, ev()),
        next(),
    )
        .prop_map(|(p, target, gen_ok, ev, next)| Op::Crash {
            p,
            target,
            gen_ok,
            ev,
            next,
        })
        .boxed()
}

fn commit_op() -> BoxedStrategy<Op> {
    (any_p(), tok(), chain(), verify(), any::<u8>())
        .prop_map(|(p, tok, chain, verify, seed)| Op::Commit {
            p,
            tok,
            chain,
            verify,
            seed,
        })
        .boxed()
}

fn assign_op() -> BoxedStrategy<Op> {
    (
        prop::collection::vec((0usize..16, 0usize..2), 1..=3),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(picks, raw)| Op::Assign { picks, raw })
        .boxed()
}

fn report_op() -> BoxedStrategy<Op> {
    (
        (0usize..16, prop::bool::weighted(0.1)),
        prop::bool::weighted(0.92),
        prop::bool::weighted(0.95),
        prop::bool::weighted(0.9),
        to(),
        prop_oneof![8 => Just(Some(0)), 1 => Just(Some(1)), 1 => Just(None)],
    )
        .prop_map(
            |((t, raw), worker_ok, attempt_ok, from_ok, to, exit)| Op::Report {
                t,
                raw,
                worker_ok,
                attempt_ok,
                from_ok,
                to,
                exit,
            },
        )
        .boxed()
}

pub(crate) fn key_use(keyed: u32) -> impl Strategy<Value = KeyUse> {
    prop_oneof![
        100 - keyed => Just(KeyUse::Unkeyed),
        keyed * 2 / 4 => Just(KeyUse::Fresh),
        keyed / 4 => (0usize..8).prop_map(KeyUse::Same),
        keyed / 4 => (0usize..8).prop_map(KeyUse::Other),
    ]
}

pub(crate) fn steps(mix: Mix) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![9 => 0i64..=mix.dt_max, 1 => -3_000i64..0],
        key_use(mix.keyed),
        op(mix),
    )
        .prop_map(|(dt, key, op)| Step { dt, key, op });
    prop::collection::vec(step, 1..=mix.max_len)
}
