//! The soak's samples as an SVG plot (`--plot FILE`): the resident memory and the open files
//! of each long-lived Squadron process, and the counts a cycle must give back (leases not
//! terminal, cgroup leaves, …), against the minutes of the run.
//!
//! Written here rather than with a plotting crate: three panels of polylines are a few lines
//! of SVG, while the plotting crates lay text out through a font backend (system fonts via
//! font-kit, or a bundled font file) that nothing else here needs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::SoakReport;

/// The most series one panel draws, the longest-seen first; a process that came and went is
/// one more series.
pub const PLOT_SERIES_MAX: usize = 12;
/// The roles of the processes that live for the whole soak (a sandbox's agent does not).
const LONG_LIVED_ROLES: [&str; 3] = ["server", "dev", "worker"];

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 230.0;
const MARGIN_TOP: f64 = 30.0;
const MARGIN_BOTTOM: f64 = 30.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line: its name and its (minutes, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title, the unit of its values, its lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: &'static str,
    pub unit: &'static str,
    pub series: Vec<Series>,
}

/// The three panels of a report: RSS (MiB) and open files per process, and every count.
pub fn panels(report: &SoakReport) -> [Panel; 3] {
    let minutes = |at_ms: u64| at_ms.saturating_sub(report.started_at_ms) as f64 / 60_000.0;
    let mut rss: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut fds: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for s in &report.samples {
        let x = minutes(s.at_ms);
        for p in s
            .processes
            .iter()
            .filter(|p| LONG_LIVED_ROLES.contains(&p.role.as_str()))
        {
            let name = format!("{} (pid {})", p.role, p.pid);
            rss.entry(name.clone())
                .or_default()
                .push((x, p.rss_bytes as f64 / (1 << 20) as f64));
            fds.entry(name).or_default().push((x, p.open_fds as f64));
        }
        for (name, count) in &s.counts {
            counts
                .entry(name.clone())
                .or_default()
                .push((x, count.n as f64));
        }
    }
    // The longest-seen first: where more than a panel's worth of processes came and went
    // (other clusters on the host), those that lived through the soak are the ones drawn.
    let series = |m: BTreeMap<String, Vec<(f64, f64)>>| {
        let mut all: Vec<Series> = m
            .into_iter()
            .map(|(name, points)| Series { name, points })
            .collect();
        all.sort_by_key(|s| std::cmp::Reverse(s.points.len()));
        all.truncate(PLOT_SERIES_MAX);
        all
    };
    [
        Panel {
            title: "resident memory of each Squadron process",
            unit: "MiB",
            series: series(rss),
        },
        Panel {
            title: "open files of each Squadron process",
            unit: "files",
            series: series(fds),
        },
        Panel {
            title: "what each cycle must give back",
            unit: "count",
            series: series(counts),
        },
    ]
}

/// The report's plot as an SVG document.
pub fn svg(report: &SoakReport) -> String {
    let panels = panels(report);
    let x_max = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| &s.points)
        .map(|(x, _)| *x)
        .fold(0.0_f64, f64::max)
        .max(1.0 / 60.0);
    let height = PANEL_HEIGHT * panels.len() as f64;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut out, panel, i as f64 * PANEL_HEIGHT, x_max);
    }
    out.push_str("</svg>\n");
    out
}

fn draw_panel(out: &mut String, panel: &Panel, top: f64, x_max: f64) {
    let (left, right) = (MARGIN_LEFT, WIDTH - MARGIN_RIGHT);
    let (y0, y1) = (top + PANEL_HEIGHT - MARGIN_BOTTOM, top + MARGIN_TOP);
    let y_max = panel
        .series
        .iter()
        .flat_map(|s| &s.points)
        .map(|(_, y)| *y)
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let _ = writeln!(
        out,
        "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{}</text>",
        top + 18.0,
        escape(panel.title)
    );
    let _ = writeln!(
        out,
        "<path d=\"M{left},{y1} L{left},{y0} L{right},{y0}\" stroke=\"black\" fill=\"none\"/>"
    );
    let labels = [
        (
            left - 6.0,
            y1 + 4.0,
            "end",
            format!("{y_max:.1} {}", panel.unit),
        ),
        (left - 6.0, y0, "end", format!("0 {}", panel.unit)),
        (left, y0 + 16.0, "start", "0 min".to_string()),
        (right, y0 + 16.0, "end", format!("{x_max:.1} min")),
    ];
    for (x, y, anchor, text) in labels {
        let _ = writeln!(
            out,
            "<text x=\"{x}\" y=\"{y}\" text-anchor=\"{anchor}\">{}</text>",
            escape(&text)
        );
    }
    for (i, s) in panel.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| {
                let px = left + x / x_max * (right - left);
                let py = y0 - y / y_max * (y0 - y1);
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let _ = writeln!(
            out,
            "<polyline points=\"{}\" stroke=\"{colour}\" stroke-width=\"1.5\" fill=\"none\"/>",
            points.join(" ")
        );
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
            right + 10.0,
            y1 + 4.0 + 15.0 * i as f64,
            escape(&s.name)
        );
    }
}

/// Text as SVG character data.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::soak::sample::{Count, ProcessFigures, Sample};
    use crate::cli::soak::verdict::{judge, Bounds};

    fn sample(at_ms: u64, cycle: u32, rss_mib: u64, leases: u64) -> Sample {
        let mut counts = BTreeMap::new();
        counts.insert("leases_not_terminal".to_string(), Count::number(leases));
        let process = |pid, role: &str| ProcessFigures {
            pid,
            role: role.into(),
            rss_bytes: rss_mib << 20,
            open_fds: 20,
        };
        Sample {
            at_ms,
            cycle,
            counts,
            processes: vec![process(10, "server"), process(11, "agent")],
            dirs: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn report(samples: Vec<Sample>) -> SoakReport {
        let bounds = Bounds {
            rss_growth_bytes_max: 64 << 20,
            fd_growth_max: 16,
        };
        SoakReport {
            format: "squadron-soak/1".into(),
            tenant: "t".into(),
            project: "p".into(),
            started_at_ms: 1_000,
            duration_ms: 120_000,
            bounds,
            cycles: Vec::new(),
            verdict: judge(&samples, Vec::new(), &bounds),
            samples,
        }
    }

    #[test]
    fn each_long_lived_process_and_each_count_is_a_line_over_the_minutes() {
        let r = report(vec![
            sample(1_000, 0, 80, 0),
            sample(61_000, 1, 84, 2),
            sample(121_000, 2, 86, 0),
        ]);
        let [rss, fds, counts] = panels(&r);
        assert_eq!(
            rss.series,
            vec![Series {
                name: "server (pid 10)".into(),
                points: vec![(0.0, 80.0), (1.0, 84.0), (2.0, 86.0)],
            }],
            "the sandbox agent is no series"
        );
        assert_eq!(fds.series[0].points[2], (2.0, 20.0));
        assert_eq!(counts.series[0].name, "leases_not_terminal");
        assert_eq!(counts.series[0].points[1], (1.0, 2.0));
        let svg = svg(&r);
        assert!(
            svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{svg}"
        );
        assert_eq!(svg.matches("<polyline ").count(), 3, "{svg}");
        assert!(
            svg.contains(">86.0 MiB</text>"),
            "the axis is the largest value: {svg}"
        );
        assert!(svg.contains(">2.0 min</text>"), "{svg}");
        // Right edge at the last minute, top at the largest value.
        assert!(
            svg.contains(&format!("{:.1},{:.1}\"", WIDTH - MARGIN_RIGHT, MARGIN_TOP)),
            "{svg}"
        );
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn text_is_escaped_and_series_are_bounded() {
        assert_eq!(escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
        // One node through the whole soak, and twenty that each came for one sample (another
        // cluster's on the same host): the bound keeps the one that lived through it.
        let samples = (0..20u32)
            .map(|i| {
                let mut s = sample(1_000 + u64::from(i) * 1_000, i, 80, 0);
                let mut passing = s.processes[0].clone();
                passing.pid = 100 + i;
                s.processes[0].pid = 9;
                s.processes.push(passing);
                s
            })
            .collect();
        let [rss, _, _] = panels(&report(samples));
        assert_eq!(rss.series.len(), PLOT_SERIES_MAX);
        assert_eq!(rss.series[0].name, "server (pid 9)");
        assert_eq!(rss.series[0].points.len(), 20);
    }
}
