//! A stand-alone runner of the comparison, for runs without the `squadron` CLI:
//! `squadron-bench-compare --squadron-bin PATH [--nodes 3] [--clients 1,16,64,256]
//! [--duration S] [--warmup S] [--workloads lease-cycle,capacity,read,submit]
//! [--systems squadron,etcd] [--no-failover] [--etcd-bin PATH] [--etcd-client grpc|gateway]
//! [--work-dir DIR]
//! [--keep-work-dir] [--seed N] [--output table|json]`, or `--render REPORT.json` to print
//! the table of a saved JSON report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use squadron_bench::{compare, render_table, CompareOptions, CompareReport, System, Workload};

/// Largest saved report `--render` reads.
const REPORT_BYTES_MAX: u64 = 16 * 1024 * 1024;

fn render_saved(path: &str) -> Result<String, String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("--render {path}: {e}"))?
        .len();
    if size > REPORT_BYTES_MAX {
        return Err(format!(
            "--render {path}: larger than {REPORT_BYTES_MAX} bytes"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("--render {path}: {e}"))?;
    let report: CompareReport =
        serde_json::from_str(&text).map_err(|e| format!("--render {path}: {e}"))?;
    Ok(render_table(&report))
}

fn parse_list<T>(text: &str, one: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    text.split(',').map(|s| one(s.trim())).collect()
}

fn options(args: &[String]) -> Result<(CompareOptions, bool), String> {
    let mut opts = CompareOptions::new(PathBuf::from("squadron"));
    let mut json = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let secs = |v: String| {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("{flag}: {v:?} is not a number of seconds"))
        };
        match flag.as_str() {
            "--nodes" => opts.nodes = value()?.parse().map_err(|_| "--nodes: not a number")?,
            "--clients" => {
                opts.clients = parse_list(&value()?, |s| {
                    s.parse()
                        .map_err(|_| format!("--clients: {s:?} is not a number"))
                })?
            }
            "--duration" => opts.duration = secs(value()?)?,
            "--warmup" => opts.warmup = secs(value()?)?,
            "--workloads" => {
                opts.workloads = parse_list(&value()?, |s| {
                    s.parse::<Workload>().map_err(|e| e.to_string())
                })?
            }
            "--systems" => {
                opts.systems = parse_list(&value()?, |s| match s {
                    "squadron" => Ok(System::Squadron),
                    "etcd" => Ok(System::Etcd),
                    other => Err(format!("--systems: unknown system {other:?}")),
                })?
            }
            "--no-failover" => opts.failover = false,
            "--squadron-bin" => opts.squadron_bin = PathBuf::from(value()?),
            "--etcd-bin" => opts.etcd_bin = PathBuf::from(value()?),
            "--etcd-client" => {
                opts.etcd_protocol = value()?
                    .parse()
                    .map_err(|e| format!("--etcd-client: {e}"))?
            }
            "--route" => opts.route = value()?.parse().map_err(|e| format!("--route: {e}"))?,
            "--work-dir" => opts.work_dir = Some(PathBuf::from(value()?)),
            "--keep-work-dir" => opts.keep_work_dir = true,
            "--seed" => opts.seed = value()?.parse().map_err(|_| "--seed: not a number")?,
            "--output" => match value()?.as_str() {
                "json" => json = true,
                "table" => json = false,
                other => return Err(format!("--output: {other:?} is not table or json")),
            },
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((opts, json))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path] = args.as_slice() {
        if flag == "--render" {
            return match render_saved(path) {
                Ok(table) => {
                    print!("{table}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    let (opts, json) = match options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match compare(&opts).await {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", render_table(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
