//! A cluster of etcd members on loopback, each with its own data directory and log, with
//! etcd's default durability (every commit is fsynced; `--unsafe-no-fsync` is never passed).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use backon::{ConstantBuilder, RetryableWithContext};

use crate::error::BenchError;
use crate::etcd_client::EtcdClient;
use crate::options::EtcdProtocol;
use crate::process::{free_port, NodeMemory, NodeProcess};
use crate::squadron_cluster::{LeaderWait, POLL_INTERVAL_MS, STARTUP_TIMEOUT_MS};

/// One status request.
const STATUS_TIMEOUT_MS: u64 = 2_000;

#[derive(Debug)]
struct EtcdMember {
    client_url: String,
    process: NodeProcess,
}

/// One look at the cluster, in the shape a retry with context takes: the cluster and the last
/// problem seen go in and come out again.
async fn look(
    (cluster, last): (&mut EtcdCluster, String),
) -> ((&mut EtcdCluster, String), Result<usize, LeaderWait>) {
    match cluster.agreed_leader(last).await {
        Ok(index) => ((cluster, String::new()), Ok(index)),
        Err(LeaderWait::NotYet(last)) => ((cluster, last.clone()), Err(LeaderWait::NotYet(last))),
        Err(exited) => ((cluster, String::new()), Err(exited)),
    }
}

/// A running etcd cluster; dropping it kills every member.
#[derive(Debug)]
pub(crate) struct EtcdCluster {
    members: Vec<EtcdMember>,
    /// The index of the member the members last agreed leads (`wait_for_leader`).
    leader: Option<usize>,
}

impl EtcdCluster {
    pub(crate) async fn start(bin: &Path, dir: &Path, n: usize) -> Result<Self, BenchError> {
        let mut ports = Vec::with_capacity(n);
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("squadron-bench-{}", std::process::id());
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            leader: None,
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{}", i + 1);
            let base = dir.join(format!("etcd-{name}"));
            std::fs::create_dir_all(&base).map_err(|e| BenchError::io("create", &base, e))?;
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut command = Command::new(bin);
            command
                .arg("--name")
                .arg(&name)
                .arg("--data-dir")
                .arg(base.join("data"))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                .args([
                    "--logger",
                    "zap",
                    "--log-outputs",
                    "stderr",
                    "--log-level",
                    "warn",
                ]);
            let process =
                NodeProcess::spawn(format!("etcd {name}"), command, base.join("etcd.log"))?;
            cluster.members.push(EtcdMember {
                client_url,
                process,
            });
        }
        cluster
            .wait_for_leader(Duration::from_millis(STARTUP_TIMEOUT_MS))
            .await?;
        Ok(cluster)
    }

    /// Client URLs of the running members, the last agreed leader first.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        let mut running: Vec<(usize, &EtcdMember)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.process.running())
            .collect();
        running.sort_by_key(|(i, _)| Some(*i) != self.leader);
        running.iter().map(|(_, m)| m.client_url.clone()).collect()
    }

    /// Waits until every running member names the same leader, one of them; returns the
    /// index of the leader among the members.
    pub(crate) async fn wait_for_leader(&mut self, timeout: Duration) -> Result<usize, BenchError> {
        let start = Instant::now();
        let polls = ConstantBuilder::default()
            .with_delay(Duration::from_millis(POLL_INTERVAL_MS))
            .with_max_times(usize::MAX);
        let ((this, _), agreed) = look
            .retry(polls)
            .context((self, String::from("no answer yet")))
            .when(|e| matches!(e, LeaderWait::NotYet(_)) && start.elapsed() < timeout)
            .await;
        match agreed {
            Ok(index) => {
                this.leader = Some(index);
                Ok(index)
            }
            Err(LeaderWait::Exited(message)) => Err(this.startup_error(message)),
            Err(LeaderWait::NotYet(last)) => {
                Err(this.startup_error(format!("no agreed leader after {timeout:?}: {last}")))
            }
        }
    }

    /// One look at every running member: the index of the leader they all name, if they
    /// agree on one of them. `last` is what the previous look found wrong, kept when this one
    /// learns nothing.
    async fn agreed_leader(&mut self, mut last: String) -> Result<usize, LeaderWait> {
        let exited = self.members.iter_mut().find_map(|n| {
            n.process
                .exited()
                .map(|s| format!("{} exited: {s}", n.process.name))
        });
        if let Some(message) = exited {
            return Err(LeaderWait::Exited(message));
        }
        let mut views = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if !m.process.running() {
                continue;
            }
            let client = EtcdClient::new(
                EtcdProtocol::Grpc,
                vec![m.client_url.clone()],
                Duration::from_millis(STATUS_TIMEOUT_MS),
                Duration::from_millis(STATUS_TIMEOUT_MS),
            );
            match client.status().await {
                Ok((member, leader)) => views.push((i, member, leader)),
                Err(e) => last = e.to_string(),
            }
        }
        let running = self.members.iter().filter(|m| m.process.running()).count();
        if views.len() == running {
            if let Some(&(_, _, leader)) = views.first() {
                let agreed = leader != 0 && views.iter().all(|v| v.2 == leader);
                if let Some(&(index, _, _)) = views.iter().find(|v| v.1 == leader) {
                    if agreed {
                        return Ok(index);
                    }
                }
                last = format!(
                    "leaders seen: {:?}",
                    views.iter().map(|v| v.2).collect::<Vec<_>>()
                );
            }
        }
        Err(LeaderWait::NotYet(last))
    }

    /// SIGKILL of member `index`.
    pub(crate) fn kill(&mut self, index: usize) {
        if let Some(m) = self.members.get_mut(index) {
            m.process.kill();
        }
    }

    pub(crate) fn memory(&self) -> Vec<NodeMemory> {
        self.members
            .iter()
            .filter_map(|m| {
                Some(NodeMemory {
                    node: m.process.name.clone(),
                    rss_kib: m.process.rss_kib()?,
                })
            })
            .collect()
    }

    fn startup_error(&self, message: String) -> BenchError {
        BenchError::Startup {
            system: "etcd",
            message,
            logs: self
                .members
                .iter()
                .map(|m| m.process.log_tail())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// The version line of an etcd binary (`etcd Version: 3.4.23`).
pub(crate) fn etcd_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}
