//! The generation-fenced Git broker against real repositories (made with the git CLI) over
//! a real Unix socket. Needs the `git` package.

mod fixture;
mod in_memory_fence;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use squadron_isolation::{
    BrokerStats, CommitOutcome, CommitRequest, GitBroker, GitBrokerClient, HeadOutcome,
    HeadRequest, RefusalCode,
};

use fixture::{git, head, Fixture, GENERATION, LEASE, PROFILE};
use in_memory_fence::InMemoryFence;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_has_the_trailers_and_exactly_the_listed_paths() {
    let f = Fixture::new().await;
    let mode = fs::metadata(&f.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "socket mode");
    let before = head(&f.repo);
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    fs::write(f.repo.join("b.txt"), "b2 changed but not listed\n").unwrap();
    fs::create_dir(f.repo.join("new")).unwrap();
    fs::write(f.repo.join("new/d.txt"), "d1\n").unwrap();

    let commit = f.commit(&f.request(&["a.txt", "new/d.txt"], "k-1")).await;

    assert_eq!(head(&f.repo), commit);
    let changed = git(&f.repo, &["show", "--name-only", "--format=", &commit]);
    assert_eq!(changed, "a.txt\nnew/d.txt");
    assert_eq!(git(&f.repo, &["show", &format!("{commit}:b.txt")]), "b1");
    assert_eq!(git(&f.repo, &["show", &format!("{commit}:a.txt")]), "a2");
    assert_eq!(git(&f.repo, &["rev-parse", &format!("{commit}^")]), before);
    assert_eq!(
        git(
            &f.repo,
            &["log", "-1", "--format=%an <%ae>|%cn <%ce>", &commit]
        ),
        "profile-1 <profile-1@squadron.invalid>|profile-1 <profile-1@squadron.invalid>"
    );
    let trailers = git(
        &f.repo,
        &["log", "-1", "--format=%(trailers:only,unfold)", &commit],
    );
    assert!(trailers.contains("Squadron-Profile: 1\n"), "{trailers}");
    assert!(trailers.contains("Squadron-Lease: 10\n"), "{trailers}");
    assert!(trailers.contains("Squadron-Generation: 1\n"), "{trailers}");
    assert!(trailers.contains("Squadron-Request-Digest: "), "{trailers}");
    assert_eq!(
        git(&f.repo, &["log", "-1", "--format=%s", &commit]),
        "change a.txt, new/d.txt"
    );
    // The worktree index follows the commit: only the unlisted change is left over.
    assert_eq!(git(&f.repo, &["status", "--porcelain"]), " M b.txt");
    git(&f.repo, &["fsck", "--strict", "--no-progress"]);

    let answer = GitBrokerClient::head(
        &f.socket,
        &HeadRequest {
            profile: PROFILE,
            lease: LEASE,
            generation: GENERATION,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        answer,
        HeadOutcome::Head {
            head: Some(commit),
            branch: Some("refs/heads/main".into())
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_replays_the_first_answer_and_writes_nothing() {
    let f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let request = f.request(&["a.txt"], "k-retry");
    let first = f.commit(&request).await;
    let before = f.snapshot();
    let checks = f.fence.checks();

    // The worktree changed again meanwhile: a replay must still not commit it.
    fs::write(f.repo.join("a.txt"), "a3\n").unwrap();
    let again = f.send(&request).await;

    assert_eq!(
        again,
        CommitOutcome::Committed {
            commit: first,
            replayed: true
        }
    );
    assert_eq!(f.snapshot(), before);
    assert_eq!(f.fence.checks(), checks, "a replay needs no fence check");
    assert_eq!(f.broker.stats().accepted, 1);
    assert_eq!(f.broker.stats().replayed, 1);

    // The same new request sent twice at once: one commit, one replay of it.
    let twice = f.request(&["a.txt"], "k-twice");
    let (one, two) = tokio::join!(f.send(&twice), f.send(&twice));
    let mut answers = [one, two];
    answers.sort_by_key(|a| matches!(a, CommitOutcome::Committed { replayed: true, .. }));
    match &answers {
        [CommitOutcome::Committed {
            commit: a,
            replayed: false,
        }, CommitOutcome::Committed {
            commit: b,
            replayed: true,
        }] => {
            assert_eq!(a, b);
            assert_eq!(&head(&f.repo), a);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_request_is_a_conflict() {
    let f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    fs::write(f.repo.join("b.txt"), "b2\n").unwrap();
    f.commit(&f.request(&["a.txt"], "k-same")).await;
    let before = f.snapshot();

    let refusal = f.refused(&f.request(&["b.txt"], "k-same")).await;

    assert_eq!(refusal.code, RefusalCode::Conflict);
    assert_eq!(refusal.field.as_deref(), Some("idempotency_key"));
    assert_eq!(f.snapshot(), before);
    assert_eq!(f.broker.stats().refused_conflict, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_generation_is_refused_and_writes_nothing() {
    let f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "from the old generation\n").unwrap();
    let stale = f.request(&["a.txt"], "k-stale");
    // A takeover: generation 2 is granted to a new lease.
    f.fence.grant(PROFILE, LEASE + 1, GENERATION + 1);
    let before = f.snapshot();

    let refusal = f.refused(&stale).await;

    assert_eq!(refusal.code, RefusalCode::StaleGeneration);
    assert_eq!(refusal.current_generation, Some(GENERATION + 1));
    assert_eq!(refusal.field.as_deref(), Some("generation"));
    assert_eq!(
        f.snapshot(),
        before,
        "a stale request changed the repository"
    );

    let head_answer = GitBrokerClient::head(
        &f.socket,
        &HeadRequest {
            profile: PROFILE,
            lease: LEASE,
            generation: GENERATION,
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(&head_answer, HeadOutcome::Refused(r) if r.code == RefusalCode::StaleGeneration),
        "{head_answer:?}"
    );

    // The control plane cannot answer: fail closed.
    let current = CommitRequest {
        lease: LEASE + 1,
        generation: GENERATION + 1,
        idempotency_key: "k-unavailable".into(),
        ..stale.clone()
    };
    f.fence.set_unavailable(true);
    let refusal = f.refused(&current).await;
    assert_eq!(refusal.code, RefusalCode::FenceUnavailable);
    assert_eq!(f.snapshot(), before);

    // The new generation commits; the stale request is still refused afterwards.
    f.fence.set_unavailable(false);
    f.commit(&current).await;
    let refusal = f
        .refused(&CommitRequest {
            expected_head: Some(head(&f.repo)),
            ..stale
        })
        .await;
    assert_eq!(refusal.code, RefusalCode::StaleGeneration);
    let stats = f.broker.stats();
    assert_eq!(
        (stats.refused_stale, stats.accepted, stats.refused_other),
        (2, 1, 1)
    );
    assert_eq!(stats.accepted_from_non_current, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_expected_head_is_refused() {
    let f = Fixture::new().await;
    let initial = head(&f.repo);
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let moved = f.commit(&f.request(&["a.txt"], "k-1")).await;
    fs::write(f.repo.join("b.txt"), "b2\n").unwrap();
    let before = f.snapshot();

    let mut late = f.request(&["b.txt"], "k-2");
    late.expected_head = Some(initial);
    let refusal = f.refused(&late).await;
    assert_eq!(refusal.code, RefusalCode::HeadMoved);
    assert_eq!(refusal.field.as_deref(), Some("expected_head"));
    assert_eq!(refusal.current_head.as_deref(), Some(moved.as_str()));

    // null claims an unborn branch, which this is not.
    let mut unborn = f.request(&["b.txt"], "k-3");
    unborn.expected_head = None;
    assert_eq!(f.refused(&unborn).await.code, RefusalCode::HeadMoved);
    assert_eq!(f.snapshot(), before);
    assert_eq!(f.broker.stats().refused_head_moved, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaping_paths_are_refused_naming_the_field() {
    let f = Fixture::new().await;
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), "secret\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), f.repo.join("link")).unwrap();
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let before = f.snapshot();

    for bad in [
        "../outside.txt",
        "sub/../../outside.txt",
        ".git/config",
        "sub/.git/hooks/pre-commit",
        "/etc/passwd",
        "link/secret",
        "sub",
        "never-existed.txt",
    ] {
        let refusal = f
            .refused(&f.request(&["a.txt", bad], &format!("k-{}", bad.len())))
            .await;
        assert_eq!(
            refusal.code,
            RefusalCode::InvalidArgument,
            "{bad}: {refusal:?}"
        );
        assert_eq!(
            refusal.field.as_deref(),
            Some("paths[1]"),
            "{bad}: {refusal:?}"
        );
    }
    assert_eq!(f.snapshot(), before);
    assert_eq!(f.broker.stats().refused_invalid, 8);
    assert_eq!(f.broker.stats().accepted, 0);

    // A listed symlink is committed as a link, as git does: its target is never read.
    std::os::unix::fs::symlink(outside.path().join("secret"), f.repo.join("outlink")).unwrap();
    let commit = f.commit(&f.request(&["a.txt", "outlink"], "k-link")).await;
    let entry = git(&f.repo, &["ls-tree", &commit, "outlink"]);
    assert!(entry.starts_with("120000 blob "), "{entry}");
    let blob = git(&f.repo, &["cat-file", "-p", &format!("{commit}:outlink")]);
    assert_eq!(blob, outside.path().join("secret").to_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_is_committed() {
    let f = Fixture::new().await;
    fs::remove_file(f.repo.join("sub/c.txt")).unwrap();
    fs::remove_dir(f.repo.join("sub")).unwrap();

    let commit = f.commit(&f.request(&["sub/c.txt"], "k-del")).await;

    let tree = git(&f.repo, &["ls-tree", "-r", "--name-only", &commit]);
    assert_eq!(tree, "a.txt\nb.txt");
    assert_eq!(
        git(&f.repo, &["show", "--name-status", "--format=", &commit]),
        "D\tsub/c.txt"
    );
    assert_eq!(git(&f.repo, &["status", "--porcelain"]), "");

    // Listing unchanged paths only is not a commit.
    let refusal = f.refused(&f.request(&["a.txt"], "k-none")).await;
    assert_eq!(refusal.code, RefusalCode::NothingToCommit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_commit_of_an_unborn_branch_expects_null() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("empty");
    fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "trunk"]);
    fs::write(repo.join("first.txt"), "first\n").unwrap();
    let fence = Arc::new(InMemoryFence::default());
    fence.grant(7, 70, 3);
    let broker = GitBroker::open(&dir.path().join("state"), fence).unwrap();
    broker
        .register_profile(7, &repo, &repo.join(".git"))
        .unwrap();

    let head_answer = broker
        .head(HeadRequest {
            profile: 7,
            lease: 70,
            generation: 3,
        })
        .await;
    assert_eq!(
        head_answer,
        HeadOutcome::Head {
            head: None,
            branch: Some("refs/heads/trunk".into())
        }
    );
    let outcome = broker
        .commit(CommitRequest {
            profile: 7,
            lease: 70,
            generation: 3,
            expected_head: None,
            paths: vec!["first.txt".into()],
            message: "first".into(),
            idempotency_key: "k-first".into(),
        })
        .await;
    let CommitOutcome::Committed {
        commit,
        replayed: false,
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(git(&repo, &["rev-parse", "refs/heads/trunk"]), commit);
    assert_eq!(git(&repo, &["rev-list", "--count", "trunk"]), "1");
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worktrees_sharing_one_git_dir_commit_concurrently() {
    const COMMITS_PER_PROFILE: usize = 12;
    let f = Fixture::new().await;
    let worktrees: Vec<(u64, std::path::PathBuf)> = (2..=3)
        .map(|profile| (profile, f.add_worktree(profile)))
        .collect();

    let mut tasks = Vec::new();
    for (profile, path) in worktrees.clone() {
        let socket = f.socket.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..COMMITS_PER_PROFILE {
                let name = format!("p{profile}-{i}.txt");
                fs::write(path.join(&name), format!("{profile} {i}\n")).unwrap();
                fs::write(path.join("a.txt"), format!("a from {profile} at {i}\n")).unwrap();
                let request = CommitRequest {
                    profile,
                    lease: 100 + profile,
                    generation: 1,
                    expected_head: Some(head(&path)),
                    paths: vec![name, "a.txt".into()],
                    message: format!("profile {profile} commit {i}"),
                    idempotency_key: format!("p{profile}-k{i}"),
                };
                let outcome = GitBrokerClient::commit(&socket, &request).await.unwrap();
                assert!(
                    matches!(
                        outcome,
                        CommitOutcome::Committed {
                            replayed: false,
                            ..
                        }
                    ),
                    "{outcome:?}"
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    git(&f.repo, &["fsck", "--strict", "--no-progress"]);
    assert_eq!(
        git(&f.repo, &["rev-list", "--count", "main"]),
        "1",
        "main moved"
    );
    for (profile, path) in &worktrees {
        let branch = format!("profile-{profile}");
        let count = git(&f.repo, &["rev-list", "--count", &branch]);
        assert_eq!(count, (COMMITS_PER_PROFILE + 1).to_string());
        let generations = git(
            &f.repo,
            &[
                "log",
                "--format=%(trailers:key=Squadron-Profile,valueonly)",
                &format!("main..{branch}"),
            ],
        );
        assert!(
            generations
                .lines()
                .filter(|l| !l.is_empty())
                .all(|l| l == profile.to_string()),
            "{generations}"
        );
        assert_eq!(
            git(path, &["status", "--porcelain"]),
            "",
            "worktree {profile}"
        );
        assert_eq!(
            git(path, &["show", &format!("{branch}:a.txt")]),
            format!("a from {profile} at {}", COMMITS_PER_PROFILE - 1)
        );
    }
    assert_eq!(f.broker.stats().accepted, 2 * COMMITS_PER_PROFILE as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_survives_a_broker_restart() {
    let mut f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let first = f.request(&["a.txt"], "k-durable");
    let commit = f.commit(&first).await;
    fs::write(f.repo.join("b.txt"), "b2\n").unwrap();
    f.commit(&f.request(&["b.txt"], "k-later")).await;

    f.restart().await;
    let before = f.snapshot();

    // HEAD moved past the first commit, so only the ledger can answer this retry.
    assert_eq!(
        f.send(&first).await,
        CommitOutcome::Committed {
            commit,
            replayed: true
        }
    );
    let refusal = f
        .refused(&CommitRequest {
            message: "other".into(),
            ..first
        })
        .await;
    assert_eq!(refusal.code, RefusalCode::Conflict);
    assert_eq!(f.snapshot(), before);
    assert_eq!(
        f.broker.stats(),
        BrokerStats {
            replayed: 1,
            refused_conflict: 1,
            ..BrokerStats::default()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_ledger_line_was_lost_is_recognised_by_its_trailer() {
    let mut f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let request = f.request(&["a.txt"], "k-lost");
    let commit = f.commit(&request).await;
    // A crash between the commit and its ledger line.
    f.stop().await;
    fs::remove_file(f.state_dir.join("commit-ledger.jsonl")).unwrap();
    f.restart().await;
    let before = f.snapshot();

    assert_eq!(
        f.send(&request).await,
        CommitOutcome::Committed {
            commit,
            replayed: true
        }
    );
    // Nothing written to the repository; the ledger learns the key again.
    assert_eq!(f.snapshot().git(), before.git());
    assert!(fs::read_to_string(f.state_dir.join("commit-ledger.jsonl"))
        .unwrap()
        .contains("k-lost"));
    assert_eq!(f.broker.stats().replayed, 1);
    assert_eq!(f.broker.stats().accepted, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_line_is_refused() {
    let f = Fixture::new().await;
    let line = vec![b'x'; squadron_isolation::git_broker::LINE_BYTES_MAX + 10];
    let answer = GitBrokerClient::exchange(&f.socket, &line).await.unwrap();
    let text = String::from_utf8(answer).unwrap();
    assert!(text.contains(r#""code":"invalid_argument""#), "{text}");
    assert!(text.contains(r#""field":"line""#), "{text}");

    let answer = GitBrokerClient::exchange(&f.socket, b"{\"op\":\"rm\"}")
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&answer).contains(r#""field":"op""#));
    assert_eq!(f.broker.stats().refused_invalid, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_during_a_commit_is_counted_as_non_current() {
    let f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    // The fence answers Current once, then generation 2 is granted: the broker's second
    // check must see it and count the commit.
    f.fence
        .grant_after_next_check(PROFILE, LEASE + 1, GENERATION + 1);
    f.commit(&f.request(&["a.txt"], "k-race")).await;
    assert_eq!(f.broker.stats().accepted_from_non_current, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ended_during_a_commit_without_a_successor_is_no_dual_writer() {
    let f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    // The fence answers Current once, then the profile's lease is released (a stop), its
    // generation kept: no newer generation wrote beside the commit.
    f.fence.release_after_next_check(PROFILE);
    f.commit(&f.request(&["a.txt"], "k-ended")).await;
    let stats = f.broker.stats();
    assert_eq!(stats.accepted_from_non_current, 0);
    assert_eq!(stats.ended_during_commit, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_match_a_mixed_run() {
    let f = Fixture::new().await;
    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let first = f.request(&["a.txt"], "k-1");
    f.commit(&first).await; // accepted
    f.send(&first).await; // replayed
    f.refused(&CommitRequest {
        message: "x".into(),
        ..first.clone()
    })
    .await; // conflict
    f.refused(&f.request(&["../x"], "k-2")).await; // invalid
    let mut moved = f.request(&["b.txt"], "k-3");
    moved.expected_head = first.expected_head.clone();
    f.refused(&moved).await; // head moved
    let mut unknown = f.request(&["b.txt"], "k-4");
    unknown.profile = 99;
    assert_eq!(f.refused(&unknown).await.code, RefusalCode::UnknownProfile); // invalid
    let mut stale = f.request(&["b.txt"], "k-5");
    stale.generation = 0;
    f.refused(&stale).await; // stale

    assert!(f.broker.unregister_profile(PROFILE));
    assert_eq!(
        f.refused(&f.request(&["b.txt"], "k-6")).await.code,
        RefusalCode::UnknownProfile
    );

    assert_eq!(
        f.broker.stats(),
        BrokerStats {
            accepted: 1,
            replayed: 1,
            refused_stale: 1,
            refused_head_moved: 1,
            refused_invalid: 3,
            refused_conflict: 1,
            refused_forbidden: 0,
            refused_other: 0,
            accepted_from_non_current: 0,
            ended_during_commit: 0,
            head_reads: 0,
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_socket_serves_that_profile_only() {
    let f = Fixture::new().await;
    let peer = f.dir.path().join("peer");
    fs::create_dir(&peer).unwrap();
    git(&peer, &["init", "-q", "-b", "main"]);
    fs::write(peer.join("p.txt"), "peer\n").unwrap();
    f.fence.grant(2, 20, 1);
    f.broker
        .register_profile(2, &peer, &peer.join(".git"))
        .unwrap();
    let own_socket = f.dir.path().join("profile-1.sock");
    let own = f.broker.serve_profile(&own_socket, PROFILE).unwrap();

    // Profile 1's process knows profile 2's lease (the worst case) and still cannot act as it.
    let forged = CommitRequest {
        profile: 2,
        lease: 20,
        generation: 1,
        expected_head: None,
        paths: vec!["p.txt".into()],
        message: "forged".into(),
        idempotency_key: "k-forged".into(),
    };
    let outcome = GitBrokerClient::commit(&own_socket, &forged).await.unwrap();
    assert!(
        matches!(&outcome, CommitOutcome::Refused(r) if r.code == RefusalCode::Forbidden
            && r.field.as_deref() == Some("profile")),
        "{outcome:?}"
    );
    assert_eq!(
        fixture::git_allow_fail(&peer, &["rev-parse", "-q", "--verify", "HEAD"]),
        "",
        "the peer's branch was born"
    );

    fs::write(f.repo.join("a.txt"), "a2\n").unwrap();
    let outcome = GitBrokerClient::commit(&own_socket, &f.request(&["a.txt"], "k-own"))
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            CommitOutcome::Committed {
                replayed: false,
                ..
            }
        ),
        "{outcome:?}"
    );
    own.shutdown().await;
    assert!(!own_socket.exists(), "socket file left behind");
    assert_eq!(f.broker.stats().refused_forbidden, 1);
}

/// A provider owns its worktree's files, `.git` among them: replacing that file with a link to
/// a peer's admin dir, or to the main repository's own Git dir, must not make the broker
/// (root) commit there. Every request opens the repository from the Git dir registered before
/// the sandbox ran, so HEAD is still the profile's own, and neither the peer's branch nor
/// `main` moves whatever HEAD the request names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_whose_dot_git_was_relinked_still_commits_only_to_its_own_branch() {
    let f = Fixture::new().await;
    let (mine, peer) = (f.add_worktree(2), f.add_worktree(3));
    let own_head = head(&mine);
    let before: Vec<String> = ["main", "profile-3"]
        .iter()
        .map(|b| git(&f.repo, &["rev-parse", b]))
        .collect();
    let mut outcomes = Vec::new();
    for target in [f.repo.join(".git/worktrees/wt-3"), f.repo.join(".git")] {
        fs::remove_file(mine.join(".git")).ok();
        std::os::unix::fs::symlink(&target, mine.join(".git")).unwrap();
        // The next generation registers the profile again, with the link in place.
        f.broker
            .register_profile(2, &mine, &f.repo.join(".git/worktrees/wt-2"))
            .unwrap();
        fs::write(mine.join("stolen.txt"), "from profile 2\n").unwrap();
        // What HEAD reads as through the link: the target's.
        let theirs = if target.ends_with(".git") {
            before[0].clone()
        } else {
            head(&peer)
        };
        for expected in [theirs, own_head.clone()] {
            let request = CommitRequest {
                profile: 2,
                lease: 102,
                generation: 1,
                expected_head: Some(expected.clone()),
                paths: vec!["stolen.txt".into()],
                message: "through a relinked .git".into(),
                idempotency_key: format!("relinked-{}", outcomes.len()),
            };
            outcomes.push(GitBrokerClient::commit(&f.socket, &request).await.unwrap());
        }
    }
    // Each request was judged (none refused as malformed), and the one naming the profile's
    // own HEAD committed.
    assert!(
        outcomes.iter().all(|o| !matches!(
            o,
            CommitOutcome::Refused(r) if r.code == RefusalCode::InvalidArgument
        )),
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, CommitOutcome::Committed { .. })),
        "{outcomes:?}"
    );
    let after: Vec<String> = ["main", "profile-3"]
        .iter()
        .map(|b| git(&f.repo, &["rev-parse", b]))
        .collect();
    assert_eq!(after, before, "a branch not the profile's moved");
    // Whatever did land, landed on the profile's own branch.
    let mine_now = git(&f.repo, &["rev-parse", "profile-2"]);
    assert!(
        mine_now == own_head || git(&f.repo, &["rev-parse", "profile-2~1"]) == own_head,
        "profile-2 is {mine_now}"
    );
    git(&f.repo, &["fsck", "--strict", "--no-progress"]);
}
