//! The project sandbox against real git repositories: one bare clone, a worktree per
//! profile sharing its `.git`, idempotence, and the proof `reset_worktree` demands. The
//! proofs here are hand-made; `agent::attempt`'s tests use real reap evidence.

use std::path::Path;

use squadron_isolation::ReapEvidence;

use super::*;
use crate::test_support::{git, SourceRepo};

fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

fn project() -> ProjectId {
    ProjectId::new("web").unwrap()
}

fn key(name: &str) -> ProfileKey {
    ProfileKey::new(name).unwrap()
}

fn open(data: &Path, repo: &SourceRepo) -> ProjectSandbox {
    ProjectSandbox::open_or_create(data, &tenant(), &project(), &repo.url(), None, None).unwrap()
}

fn evidence(cgroup: &str, populated: bool) -> ReapEvidence {
    ReapEvidence {
        cgroup: cgroup.to_owned(),
        populated,
        observed_at_ms: now_ms(),
        steps: vec!["made by the test".to_owned()],
    }
}

#[test]
fn one_clone_and_a_worktree_per_profile_sharing_its_git_dir_idempotently() {
    let repo = SourceRepo::new();
    let data = tempfile::tempdir().unwrap();
    let sandbox = open(data.path(), &repo);
    let root = fs::canonicalize(data.path())
        .unwrap()
        .join("projects/acme/web");
    assert_eq!(sandbox.root(), root);
    assert_eq!(sandbox.sandbox_ref(), root.display().to_string());
    assert_eq!(sandbox.record().base_commit, repo.main_head);
    // repo/ holds the bare clone only.
    let repo_entries: Vec<String> = list_names(&root.join(REPO_DIR)).unwrap();
    assert_eq!(repo_entries, vec![".git".to_owned()]);
    assert_eq!(
        git(&sandbox.git_dir(), &["rev-parse", "--is-bare-repository"]).trim(),
        "true"
    );

    let keys = [key("alpha"), key("beta"), key("agent-3")];
    for k in &keys {
        let paths = sandbox.ensure_profile(k).unwrap();
        assert_eq!(paths.branch, format!("squadron/{k}"));
        assert!(paths.state.is_dir() && paths.logs.is_dir() && paths.run.is_dir());
    }
    let alpha = sandbox.profile_paths(&keys[0]);
    fs::write(alpha.worktree.join("README.md"), "edited by alpha\n").unwrap();
    fs::write(alpha.worktree.join("mine.txt"), "untracked\n").unwrap();

    // Again, through a new object: nothing is cloned, created or reset a second time.
    let again = open(data.path(), &repo);
    for k in &keys {
        again.ensure_profile(k).unwrap();
    }
    assert_eq!(
        fs::read_to_string(alpha.worktree.join("README.md")).unwrap(),
        "edited by alpha\n"
    );
    assert!(alpha.worktree.join("mine.txt").exists());
    let mut sorted = keys.to_vec();
    sorted.sort();
    assert_eq!(again.profiles().unwrap(), sorted);
    let clones: Vec<String> = list_names(&root)
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(CLONING_DIR_NAME))
        .collect();
    assert!(clones.is_empty(), "{clones:?}");

    // Every worktree links to the one common directory, on its own branch at the base.
    let common = sandbox.git_dir();
    for k in &keys {
        let paths = sandbox.profile_paths(k);
        let link = fs::read_to_string(paths.worktree.join(".git")).unwrap();
        assert_eq!(
            link.trim_end().trim_end_matches('/'),
            format!("gitdir: {}/worktrees/{k}", common.display())
        );
        let common_seen = git(&paths.worktree, &["rev-parse", "--git-common-dir"]);
        assert_eq!(
            fs::canonicalize(paths.worktree.join(common_seen.trim())).unwrap(),
            common
        );
        assert_eq!(
            git(&paths.worktree, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
            paths.branch
        );
        assert_eq!(
            git(&paths.worktree, &["rev-parse", "HEAD"]).trim(),
            repo.main_head
        );
    }
    let beta = sandbox.profile_paths(&keys[1]);
    assert_eq!(
        fs::read_to_string(beta.worktree.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 {\n    43\n}\n"
    );
    assert_eq!(git(&beta.worktree, &["status", "--porcelain"]), "");
    let listing = git(&common, &["worktree", "list", "--porcelain"]);
    for k in &keys {
        assert!(
            listing.contains(&format!("branch refs/heads/squadron/{k}\n")),
            "{listing}"
        );
    }
    assert_eq!(
        listing.matches("worktree ").count(),
        4,
        "bare + 3: {listing}"
    );

    // A creation cut short (no ready mark, files missing) and never run in is made again.
    fs::remove_file(beta.run.join(WORKTREE_READY_NAME)).unwrap();
    fs::remove_dir_all(beta.worktree.join("src")).unwrap();
    sandbox.ensure_profile(&keys[1]).unwrap();
    assert!(beta.worktree.join("src/lib.rs").is_file());
    assert!(beta.run.join(WORKTREE_READY_NAME).exists());
    assert_eq!(git(&beta.worktree, &["status", "--porcelain"]), "");
}

#[test]
fn a_branch_is_the_base_and_another_url_or_branch_is_refused() {
    let repo = SourceRepo::new();
    let data = tempfile::tempdir().unwrap();
    let sandbox = ProjectSandbox::open_or_create(
        data.path(),
        &tenant(),
        &project(),
        &repo.file_url(),
        Some("feature"),
        None,
    )
    .unwrap();
    assert_eq!(sandbox.record().base_commit, repo.feature_head);
    let paths = sandbox.ensure_profile(&key("alpha")).unwrap();
    assert!(paths.worktree.join("feature.txt").exists());

    let other = SourceRepo::new();
    let err = ProjectSandbox::open_or_create(
        data.path(),
        &tenant(),
        &project(),
        &other.file_url(),
        Some("feature"),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("invalid repository.url"), "{err}");
    assert!(!err.contains(&other.url()), "the url leaked: {err}");
    let err = ProjectSandbox::open_or_create(
        data.path(),
        &tenant(),
        &project(),
        &repo.file_url(),
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("invalid branch"), "{err}");

    let err = ProjectSandbox::open_or_create(
        data.path(),
        &tenant(),
        &ProjectId::new("other").unwrap(),
        &repo.url(),
        Some("no-such-branch"),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no-such-branch"), "{err}");
}

#[test]
fn system_directories_and_foreign_worktree_directories_are_refused() {
    let repo = SourceRepo::new();
    let shown = Path::new("/usr/share/squadron-test-never-created");
    let err = ProjectSandbox::open_or_create(shown, &tenant(), &project(), &repo.url(), None, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid data_dir") && err.contains("/usr"),
        "{err}"
    );
    assert!(!shown.exists());

    let data = tempfile::tempdir().unwrap();
    let sandbox = open(data.path(), &repo);
    let paths = sandbox.profile_paths(&key("alpha"));
    fs::create_dir_all(&paths.worktree).unwrap();
    fs::write(paths.worktree.join("precious"), "keep\n").unwrap();
    let err = sandbox
        .ensure_profile(&key("alpha"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a git worktree"), "{err}");
    assert_eq!(
        fs::read_to_string(paths.worktree.join("precious")).unwrap(),
        "keep\n"
    );
    assert!(sandbox.profiles().unwrap().is_empty());
}

#[test]
fn reset_demands_proof_for_the_last_started_generation_only() {
    let repo = SourceRepo::new();
    let data = tempfile::tempdir().unwrap();
    let sandbox = open(data.path(), &repo);
    let alpha = key("alpha");
    let paths = sandbox.ensure_profile(&alpha).unwrap();

    // Never started here: nothing can be writing, no proof is needed.
    fs::write(paths.worktree.join("README.md"), "scribbled\n").unwrap();
    assert_eq!(
        sandbox.reset_worktree(&alpha, None).unwrap(),
        repo.main_head
    );
    assert_eq!(git(&paths.worktree, &["status", "--porcelain"]), "");

    // Generations 1 and 2 start (leaves that never existed: absent, so not populated).
    let leaf = |g: u64| data.path().join(format!("cgroup/profile-alpha-g{g}"));
    sandbox
        .record_start(&paths, Generation::new(1), &leaf(1), || Ok(()))
        .unwrap();
    // Generation 1 may still be starting: until it exits or is reaped, 2 waits.
    let err = sandbox
        .record_start(&paths, Generation::new(2), &leaf(2), || Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("neither exited nor been reaped"), "{err}");
    fs::write(paths.exit_code_file(Generation::new(1)), "0\n").unwrap();
    sandbox
        .record_start(&paths, Generation::new(2), &leaf(2), || Ok(()))
        .unwrap();
    assert_eq!(
        sandbox.started_generations(&alpha).unwrap(),
        vec![Generation::new(1), Generation::new(2)]
    );
    for (g, why) in [(2, "started already"), (1, "older than generation 2")] {
        let err = sandbox
            .record_start(&paths, Generation::new(g), &leaf(g), || Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{err}");
    }
    let refused = sandbox
        .record_start(&paths, Generation::new(3), &leaf(3), || {
            Err(invalid("generation", "the precheck says no"))
        })
        .unwrap_err()
        .to_string();
    assert!(refused.contains("the precheck says no"), "{refused}");
    assert_eq!(sandbox.started_generations(&alpha).unwrap().len(), 2);

    // The agent leaves a mess: edits, untracked files, a symlink out, a fake .git directory.
    fs::write(paths.worktree.join("README.md"), "mess\n").unwrap();
    fs::write(paths.worktree.join("junk.txt"), "junk\n").unwrap();
    let outside = data.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("keep.txt"), "outside\n").unwrap();
    std::os::unix::fs::symlink(&outside, paths.worktree.join("link")).unwrap();
    fs::remove_file(paths.worktree.join(".git")).unwrap();
    fs::create_dir_all(paths.worktree.join(".git/hooks")).unwrap();

    let g1 = leaf(1).display().to_string();
    let g2 = leaf(2).display().to_string();
    for (proof, why) in [
        (None, "missing"),
        (Some(evidence(&g1, false)), "the last one started"),
        (Some(evidence(&g2, true)), "still populated"),
    ] {
        let err = sandbox
            .reset_worktree(&alpha, proof.as_ref())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid reap evidence") && err.contains(why),
            "{why}: {err}"
        );
        assert!(err.contains("generation 2"), "{err}");
        assert_eq!(
            fs::read_to_string(paths.worktree.join("README.md")).unwrap(),
            "mess\n",
            "a refused reset touched the worktree"
        );
    }

    let commit = sandbox
        .reset_worktree(&alpha, Some(&evidence(&g2, false)))
        .unwrap();
    assert_eq!(commit, repo.main_head);
    assert_eq!(
        fs::read_to_string(paths.worktree.join("README.md")).unwrap(),
        "# Project\n\nfirst line\n"
    );
    assert!(!paths.worktree.join("junk.txt").exists());
    assert!(fs::symlink_metadata(paths.worktree.join("link")).is_err());
    assert_eq!(
        fs::read_to_string(outside.join("keep.txt")).unwrap(),
        "outside\n",
        "the reset followed a symlink"
    );
    assert!(paths.worktree.join(".git").is_file());
    assert_eq!(git(&paths.worktree, &["status", "--porcelain"]), "");
    assert_eq!(
        git(&paths.worktree, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "squadron/alpha"
    );
}

/// Unmounts (lazily) whatever is mounted at the path when dropped, so a failing test leaves no
/// loop mount behind and its temporary directory can go.
struct MountGuard(std::path::PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .output();
    }
}

fn mounted(dir: &Path) -> bool {
    squadron_isolation::secret_tmpfs::is_mount_point(dir).unwrap_or(false)
}

/// The whole sandbox lives on its disk quota: a worktree written without end meets "no space
/// left" at the quota (the host's disk holds no more than the image's size), the volume says
/// it is used up, and after a reboot's lost mount the next opening mounts it again with the
/// sandbox's files. A sandbox made before quotas keeps its files and gets none.
#[test]
fn a_sandbox_lives_on_its_disk_quota_and_a_lost_mount_comes_back() {
    if !crate::task::task_volume::may_mount() {
        panic!("this test loop-mounts an image: run it as root");
    }
    let repo = SourceRepo::new();
    let data = tempfile::tempdir().unwrap();
    let data_dir = fs::canonicalize(data.path()).unwrap();
    let quota = squadron_isolation::disk_quota::QUOTA_BYTES_MIN;
    let root = data_dir.join(PROJECTS_DIR).join("acme").join("web");
    let _guard = MountGuard(root.clone());
    let open_with_quota = || {
        ProjectSandbox::open_or_create(
            &data_dir,
            &tenant(),
            &project(),
            &repo.url(),
            None,
            Some(quota),
        )
    };
    let sandbox = open_with_quota().unwrap();
    assert_eq!(sandbox.root(), root);
    assert!(mounted(&root), "{} is not a mount point", root.display());
    let volume = ProjectVolume::of(&data_dir, &tenant(), &project());
    assert_eq!(volume.exhausted(), None);
    let paths = sandbox.ensure_profile(&key("alpha")).unwrap();
    assert!(paths.worktree.join("README.md").exists());
    // The worker's records are not on the volume: `run/` is the host's.
    assert!(mounted(&root.join(RUN_DIR)));

    // Root writes past the quota and its headroom too: the image's size is the bound.
    let big = paths.worktree.join("big.bin");
    let mut file = fs::File::create(&big).unwrap();
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0u64;
    let full = (0..64).find_map(|_| {
        let wrote = std::io::Write::write_all(&mut file, &chunk).and_then(|()| file.sync_data());
        written += chunk.len() as u64;
        wrote.err()
    });
    let err = full.expect("64 MiB fit a 16 MiB quota");
    assert_eq!(err.raw_os_error(), Some(28), "not ENOSPC: {err}");
    assert!(
        written <= quota + squadron_isolation::disk_quota::QUOTA_HEADROOM_BYTES + (1 << 20),
        "{written} bytes went in before the quota stopped them"
    );
    drop(file);
    assert_eq!(volume.exhausted(), Some(quota));
    // A full volume leaves the worker's records writable: a start can still be recorded.
    fs::create_dir_all(&paths.run).unwrap();
    fs::write(paths.run.join("g1.started"), b"{}").expect("a record on a full volume");
    fs::remove_file(&big).unwrap();

    // A reboot unmounts it: the sandbox's files are out of sight until it is mounted again.
    // Tried again while busy: a process another test forks holds the test's descriptors for
    // the moment between its fork and its exec.
    let mut out = None;
    for _ in 0..50 {
        let tried = std::process::Command::new("umount")
            .arg("-R")
            .arg(&root)
            .output()
            .unwrap();
        let busy = String::from_utf8_lossy(&tried.stderr).contains("busy");
        out = Some(tried);
        if !busy {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = out.expect("umount ran");
    assert!(out.status.success(), "{out:?}");
    assert!(!root.join(SANDBOX_RECORD_NAME).exists());
    ProjectVolume::remount_all(&data_dir);
    assert!(mounted(&root));
    assert!(mounted(&root.join(RUN_DIR)));
    assert!(paths.run.join("g1.started").exists());
    let again = open_with_quota().unwrap();
    assert_eq!(again.record(), sandbox.record());
    assert!(again.has_worktree(&key("alpha")));

    // Made before quotas: its files stay in view, and it runs without one.
    let legacy = ProjectSandbox::open_or_create(
        &data_dir,
        &tenant(),
        &ProjectId::new("legacy").unwrap(),
        &repo.url(),
        None,
        None,
    )
    .unwrap();
    let legacy_root = legacy.root().to_path_buf();
    let _legacy_guard = MountGuard(legacy_root.clone());
    let reopened = ProjectSandbox::open_or_create(
        &data_dir,
        &tenant(),
        &ProjectId::new("legacy").unwrap(),
        &repo.url(),
        None,
        Some(quota),
    )
    .unwrap();
    assert!(!mounted(&legacy_root));
    assert_eq!(reopened.record(), legacy.record());
}

/// A new generation's launch removes the launch files of reaped generations before its
/// predecessor (their mailbox and prompt would pile up on the host with every takeover), and
/// keeps its predecessor's (the catch-up reads them), an unreaped one's, and every record.
#[test]
fn old_reaped_generations_lose_their_launch_files_and_keep_their_records() {
    let repo = SourceRepo::new();
    let data = tempfile::tempdir().unwrap();
    let sandbox = open(data.path(), &repo);
    let paths = sandbox.ensure_profile(&key("alpha")).unwrap();
    for k in 1..=4u64 {
        let g = Generation::new(k);
        fs::create_dir_all(paths.generation_run_dir(g)).unwrap();
        fs::write(paths.generation_run_dir(g).join("mailbox.jsonl"), b"{}").unwrap();
        fs::write(paths.started_marker(g), b"{}").unwrap();
        if k != 2 {
            fs::write(paths.reaped_record(g), b"{}").unwrap();
        }
    }
    assert_eq!(prune_launch_files(&paths, Generation::new(5)).unwrap(), 2);
    let kept = |k: u64| paths.generation_run_dir(Generation::new(k)).exists();
    assert!(
        !kept(1) && kept(2) && !kept(3) && kept(4),
        "1 and 3 go; 2 unreaped, 4 previous"
    );
    for k in 1..=4u64 {
        assert!(paths.started_marker(Generation::new(k)).exists());
    }
    assert!(paths.reaped_record(Generation::new(1)).exists());
}
