//! The human-readable rendering of a report: one row per workload and client count.

use std::fmt::Write;

use comfy_table::{presets, CellAlignment, ContentArrangement, Table, TableComponent};

use crate::load::PointStats;
use crate::options::{ClientRoute, EtcdProtocol};
use crate::report::{mean_rss_kib, CompareReport};

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) => format!("{x:.decimals$}"),
        None => "-".into(),
    }
}

fn system_cells(s: Option<&PointStats>) -> [String; 4] {
    match s {
        Some(s) if s.latency.count == 0 => [
            format!("{:.0}", s.ops_per_s),
            "-".into(),
            "-".into(),
            "-".into(),
        ],
        Some(s) => [
            format!("{:.0}", s.ops_per_s),
            format!("{:.2}", s.latency.p50_ms),
            format!("{:.2}", s.latency.p99_ms),
            format!("{:.2}", s.latency.p999_ms),
        ],
        None => ["-".into(), "-".into(), "-".into(), "-".into()],
    }
}

/// One row per workload and client count, the header underlined; the point's columns on the
/// left, numbers right-aligned (drawn by `comfy-table`, without borders).
fn points_table(report: &CompareReport) -> String {
    let header = [
        "workload",
        "clients",
        "sq ops/s",
        "sq p50",
        "sq p99",
        "sq p999",
        "etcd ops/s",
        "etcd p50",
        "etcd p99",
        "etcd p999",
        "x ops/s",
        "x p50",
        "x p99",
        "x p999",
    ];
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_style(TableComponent::HeaderLines, '-')
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(with_separators(
            header.iter().map(|h| h.to_string()).collect(),
        ));
    for p in &report.points {
        let mut row = vec![p.workload.to_string(), p.clients.to_string()];
        row.extend(system_cells(p.squadron.as_ref()));
        row.extend(system_cells(p.etcd.as_ref()));
        let r = p.ratio.unwrap_or_default();
        row.extend([
            num(r.ops_per_s, 2),
            num(r.p50, 2),
            num(r.p99, 2),
            num(r.p999, 2),
        ]);
        table.add_row(with_separators(row));
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, 1));
        if i > 0 {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = String::new();
    for line in table.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The cells with a `|` column after each of [`SEPARATED_AFTER`].
fn with_separators(cells: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(cells.len() + SEPARATED_AFTER.len());
    for (i, cell) in cells.into_iter().enumerate() {
        out.push(cell);
        if SEPARATED_AFTER.contains(&i) {
            out.push("|".into());
        }
    }
    out
}

/// Columns after which a `|` separates the systems: the point, squadron, etcd, the ratios.
const SEPARATED_AFTER: [usize; 3] = [1, 5, 9];

/// The report as a fixed-width table (latencies in ms; ratios are Squadron / etcd), then
/// failover, memory and any errors met.
pub fn render_table(report: &CompareReport) -> String {
    let mut out = points_table(report);
    out.push_str(&format!(
        "latencies in ms; x = squadron / etcd (ops/s: higher is better for squadron, latencies: \
         lower); etcd driven through its {}; {}\n",
        match report.etcd_protocol {
            EtcdProtocol::Grpc => "gRPC API",
            EtcdProtocol::Gateway => "JSON gateway",
        },
        match report.route {
            ClientRoute::Leader => "every client sends to the leader",
            ClientRoute::Spread => "client i sends to node i mod n",
        }
    ));
    failover_lines(report, &mut out);
    memory_lines(report, &mut out);
    internals_line(report, &mut out);
    error_lines(report, &mut out);
    out
}

fn failover_lines(report: &CompareReport, out: &mut String) {
    let f = &report.failover;
    if f.squadron.is_some() || f.etcd.is_some() {
        out.push_str("\nfailover (kill -9 of the leader under lease-cycle load; time to the first successful write):\n");
        for (name, r) in [("squadron", &f.squadron), ("etcd", &f.etcd)] {
            if let Some(r) = r {
                let recovery = match r.recovery_ms {
                    Some(ms) => format!("{ms:.0} ms"),
                    None => format!("no write within {} ms", r.wait_ms_max),
                };
                let elected = match r.leader_elected_ms {
                    Some(ms) => format!("new leader seen after {ms:.0} ms"),
                    None => "no new leader seen".into(),
                };
                let _ = writeln!(
                    out,
                    "  {name:<8} {recovery} ({elected}; killed {}, {} clients, {} failed ops meanwhile)",
                    r.killed, r.clients, r.load.errors
                );
            }
        }
        let _ = writeln!(out, "  x        {}", num(f.ratio, 2));
    }
}

fn memory_lines(report: &CompareReport, out: &mut String) {
    let m = &report.memory;
    if !m.squadron.is_empty() || !m.etcd.is_empty() {
        out.push_str("\nmemory (RSS per node at the end of the workloads):\n");
        for (name, nodes) in [("squadron", &m.squadron), ("etcd", &m.etcd)] {
            if nodes.is_empty() {
                continue;
            }
            let each: Vec<String> = nodes
                .iter()
                .map(|n| format!("{:.1}", n.rss_kib as f64 / 1024.0))
                .collect();
            let _ = writeln!(
                out,
                "  {name:<8} {} MiB (mean {:.1} MiB)",
                each.join(" / "),
                mean_rss_kib(nodes) / 1024.0
            );
        }
        let _ = writeln!(out, "  x        {}", num(m.ratio, 2));
    }
}

fn internals_line(report: &CompareReport, out: &mut String) {
    if let Some(i) = &report.squadron_internals {
        let _ = writeln!(
            out,
            "\nsquadron batching (all nodes): {} log entries in {} fsyncs ({} per fsync); \
             {} writes in {} proposed entries ({} per entry), {} forwarded by followers; {} reads \
             in {} read-index rounds ({} per round)",
            i.log_entries,
            i.log_appends,
            num(i.entries_per_fsync(), 2),
            i.proposal_commands,
            i.proposal_entries,
            num(i.writes_per_entry(), 2),
            i.forwards,
            i.reads,
            i.read_rounds,
            num(i.reads_per_round(), 2),
        );
    }
}

/// The points that met refusals or errors, with the first error of each.
fn error_lines(report: &CompareReport, out: &mut String) {
    let mut notes = Vec::new();
    for p in &report.points {
        for (name, s) in [("squadron", &p.squadron), ("etcd", &p.etcd)] {
            if let Some(s) = s {
                if s.refused > 0 || s.errors > 0 {
                    let mut note = format!(
                        "  {name} {} @{}: {} ok, {} refused, {} errors",
                        p.workload, p.clients, s.ok, s.refused, s.errors
                    );
                    if let Some(e) = &s.first_error {
                        let _ = write!(note, " (first error: {e})");
                    }
                    notes.push(note);
                }
            }
        }
    }
    if !notes.is_empty() {
        out.push_str("\nrefusals and errors:\n");
        for n in notes {
            out.push_str(&n);
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::LatencySummary;
    use crate::machine::MachineInfo;
    use crate::options::Workload;
    use crate::process::NodeMemory;
    use crate::report::{
        ComparePoint, FailoverComparison, FailoverResult, MemoryComparison, Ratios,
        SquadronInternals,
    };

    fn stats(ops: f64, p50: f64, errors: u64) -> PointStats {
        PointStats {
            ops_per_s: ops,
            ok: 100,
            refused: 0,
            errors,
            window_s: 10.0,
            latency: LatencySummary {
                count: 100,
                mean_ms: p50,
                p50_ms: p50,
                p99_ms: p50 * 2.0,
                p999_ms: p50 * 4.0,
                max_ms: p50 * 5.0,
            },
            first_error: (errors > 0).then(|| "no leader".to_string()),
        }
    }

    fn report() -> CompareReport {
        let (s, e) = (stats(1500.0, 2.0, 0), stats(1000.0, 4.0, 3));
        CompareReport {
            machine: MachineInfo::default(),
            squadron_version: "squadron 0.1.0".into(),
            etcd_version: "etcd Version: 3.4.23".into(),
            etcd_protocol: EtcdProtocol::Grpc,
            route: ClientRoute::Leader,
            nodes: 3,
            clients: vec![16],
            duration_s: 10.0,
            warmup_s: 1.0,
            seed: 1,
            points: vec![
                ComparePoint {
                    workload: Workload::LeaseCycle,
                    clients: 16,
                    ratio: Some(Ratios::of(&s, &e)),
                    squadron: Some(s),
                    etcd: Some(e),
                },
                ComparePoint {
                    workload: Workload::Read,
                    clients: 16,
                    squadron: Some(stats(900.0, 1.0, 0)),
                    etcd: None,
                    ratio: None,
                },
            ],
            failover: FailoverComparison {
                squadron: Some(FailoverResult {
                    clients: 16,
                    killed: "squadron node 1".into(),
                    recovery_ms: Some(700.0),
                    leader_elected_ms: Some(650.0),
                    wait_ms_max: 30_000,
                    load: stats(10.0, 1.0, 5),
                }),
                etcd: Some(FailoverResult {
                    clients: 16,
                    killed: "etcd m2".into(),
                    recovery_ms: None,
                    leader_elected_ms: None,
                    wait_ms_max: 30_000,
                    load: stats(10.0, 1.0, 9),
                }),
                ratio: None,
            },
            squadron_internals: Some(SquadronInternals {
                log_appends: 100,
                log_entries: 250,
                proposal_entries: 40,
                proposal_commands: 200,
                read_rounds: 10,
                reads: 90,
                forwards: 0,
            }),
            memory: MemoryComparison {
                squadron: vec![NodeMemory {
                    node: "squadron node 1".into(),
                    rss_kib: 51_200,
                }],
                etcd: vec![],
                ratio: None,
            },
            work_dir: None,
        }
    }

    #[test]
    fn a_report_saved_before_the_protocol_choice_reads_as_the_gateways() {
        let mut saved = serde_json::to_value(report()).unwrap();
        saved.as_object_mut().unwrap().remove("etcd_protocol");
        let r: CompareReport = serde_json::from_value(saved).unwrap();
        assert_eq!(r.etcd_protocol, EtcdProtocol::Gateway);
        assert!(render_table(&r).contains("etcd driven through its JSON gateway"));
        assert!(render_table(&report()).contains("etcd driven through its gRPC API"));
    }

    #[test]
    fn a_report_saved_before_the_route_choice_reads_as_spread() {
        let mut saved = serde_json::to_value(report()).unwrap();
        saved.as_object_mut().unwrap().remove("route");
        let r: CompareReport = serde_json::from_value(saved).unwrap();
        assert_eq!(r.route, ClientRoute::Spread);
        assert!(render_table(&r).contains("client i sends to node i mod n"));
        assert!(render_table(&report()).contains("every client sends to the leader"));
    }

    #[test]
    fn rows_carry_both_systems_and_the_ratios() {
        let text = render_table(&report());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("workload") && lines[0].contains("x p999"),
            "{text}"
        );
        assert!(lines[1].chars().all(|c| c == '-'), "{text}");
        let row: Vec<&str> = lines[2].split_whitespace().filter(|c| *c != "|").collect();
        assert_eq!(
            row,
            [
                "lease-cycle",
                "16",
                "1500",
                "2.00",
                "4.00",
                "8.00",
                "1000",
                "4.00",
                "8.00",
                "16.00",
                "1.50",
                "0.50",
                "0.50",
                "0.50"
            ],
            "{text}"
        );
        let missing: Vec<&str> = lines[3].split_whitespace().filter(|c| *c != "|").collect();
        assert_eq!(missing[0], "read");
        assert_eq!(&missing[6..], ["-"; 8], "{text}");
        // Columns line up: every row has its separators at the header's positions.
        let bars = |l: &str| l.match_indices('|').map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(bars(lines[0]), bars(lines[2]), "{text}");
        assert_eq!(bars(lines[0]), bars(lines[3]), "{text}");
    }

    #[test]
    fn a_side_without_completed_operations_has_no_latency_ratios() {
        let slow = PointStats {
            ops_per_s: 0.0,
            ok: 0,
            errors: 2,
            ..PointStats::default()
        };
        let fast = stats(100.0, 1.0, 0);
        let r = Ratios::of(&slow, &fast);
        assert_eq!(r.ops_per_s, Some(0.0));
        assert_eq!((r.p50, r.p99, r.p999), (None, None, None));
        let mut rep = report();
        rep.points[0].squadron = Some(slow);
        rep.points[0].ratio = Some(r);
        let text = render_table(&rep);
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(&row[2..7], ["|", "0", "-", "-", "-"], "{text}");
        assert_eq!(&row[row.len() - 4..], ["0.00", "-", "-", "-"], "{text}");
    }

    #[test]
    fn failover_memory_and_errors_are_listed() {
        let text = render_table(&report());
        assert!(
            text.contains("squadron 700 ms (new leader seen after 650 ms; killed squadron node 1"),
            "{text}"
        );
        assert!(
            text.contains("etcd     no write within 30000 ms (no new leader seen;"),
            "{text}"
        );
        assert!(text.contains("squadron 50.0 MiB (mean 50.0 MiB)"), "{text}");
        assert!(
            text.contains("250 log entries in 100 fsyncs (2.50 per fsync)")
                && text.contains("200 writes in 40 proposed entries (5.00 per entry)")
                && text.contains("90 reads in 10 read-index rounds (9.00 per round)"),
            "{text}"
        );
        assert!(
            text.contains(
                "etcd lease-cycle @16: 100 ok, 0 refused, 3 errors (first error: no leader)"
            ),
            "{text}"
        );
        assert!(!text.contains("squadron lease-cycle @16"), "{text}");
    }
}
