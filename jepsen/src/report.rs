//! `report.html`: a self-contained page (inline SVG, no scripts, nothing fetched) with a
//! timeline of operations per client, the nemesis's faults shaded, and a latency plot.

use std::fmt::Write as _;

use serde_json::Value;

use crate::event::Process;
use crate::history::History;
use crate::operation::{Completion, Operation};
use crate::results::{Results, Validity};

/// Most operations drawn; beyond it, every n-th one is (the counts stay exact).
pub const RENDER_OPS_MAX: usize = 20_000;
/// Most client lanes in the timeline.
pub const LANES_MAX: u64 = 64;
const WIDTH: f64 = 1200.0;
const LANE_PX: f64 = 14.0;
const PLOT_PX: f64 = 300.0;
const MARGIN: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(c: Completion) -> &'static str {
    match c {
        Completion::Ok => "#3a9d5d",
        Completion::Fail => "#d9534f",
        Completion::Info => "#f0ad4e",
    }
}

/// The report renderer.
#[derive(Debug)]
pub struct HtmlReport;

impl HtmlReport {
    pub fn render(history: &History, results: &Results) -> String {
        let ops = history.operations().unwrap_or_default();
        let end_ms = history
            .events
            .last()
            .map(|e| e.time_ms)
            .unwrap_or(0.0)
            .max(1.0);
        let lanes = results
            .run
            .get("concurrency")
            .and_then(Value::as_u64)
            .unwrap_or(LANES_MAX)
            .clamp(1, LANES_MAX);
        let step = ops.len().div_ceil(RENDER_OPS_MAX).max(1);
        let shown: Vec<&Operation> = ops.iter().step_by(step).collect();
        let x = |t: f64| MARGIN + (t / end_ms) * (WIDTH - 2.0 * MARGIN);
        let nemesis = history.nemesis_intervals();

        let mut page = String::new();
        let verdict = match results.valid {
            Validity::Valid => ("valid", "#3a9d5d"),
            Validity::Invalid => ("INVALID", "#d9534f"),
            Validity::Unknown => ("unknown", "#f0ad4e"),
        };
        let _ = write!(
            page,
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>squadron-jepsen report</title>\
             <style>body{{font-family:sans-serif;margin:20px}}table{{border-collapse:collapse}}\
             td,th{{border:1px solid #ccc;padding:2px 8px;font-size:13px}}pre{{font-size:12px}}</style>\
             </head><body><h1>squadron-jepsen: <span style=\"color:{}\">{}</span></h1>",
            verdict.1, verdict.0
        );
        let _ = write!(page, "<pre>{}</pre>", esc(&results.summary()));
        let _ = write!(
            page,
            "<p>Run: <code>{}</code></p>",
            esc(&serde_json::to_string(&results.run).unwrap_or_default())
        );
        if !results.anomalies.is_empty() {
            page.push_str("<h2>Anomalies</h2><table><tr><th>kind</th><th>key</th><th>ops</th><th>message</th></tr>");
            for a in &results.anomalies {
                let _ = write!(
                    page,
                    "<tr><td>{:?}</td><td>{}</td><td>{:?}</td><td>{}</td></tr>",
                    a.kind,
                    esc(a.key.as_deref().unwrap_or("-")),
                    a.ops,
                    esc(&a.message)
                );
            }
            page.push_str("</table>");
        }

        // Timeline: one lane per client (process id modulo the client count).
        let height = MARGIN + lanes as f64 * LANE_PX + 30.0;
        let _ = write!(
            page,
            "<h2>Timeline</h2><p>One lane per client; green ok, red fail, orange unknown (drawn until the \
             client gave up); grey bands are faults. Hover for details.</p>\
             <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\">"
        );
        Self::shade(&mut page, &nemesis, &x, 30.0, height - 30.0, end_ms);
        for l in 0..lanes {
            let y = MARGIN + l as f64 * LANE_PX;
            let _ = write!(
                page,
                "<text x=\"4\" y=\"{}\" font-size=\"10\">c{l}</text>",
                y + 10.0
            );
        }
        for op in &shown {
            let Process::Client(p) = op.process else {
                continue;
            };
            let lane = if p >= 1_000_000 { lanes - 1 } else { p % lanes };
            let y = MARGIN + lane as f64 * LANE_PX;
            let (x0, x1) = (x(op.invoke_ms), x(op.complete_ms.unwrap_or(end_ms)));
            let _ = write!(
                page,
                "<rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{}\" fill=\"{}\" opacity=\"0.8\">\
                 <title>#{} p{} {} {} {} → {:?} {}</title></rect>",
                (x1 - x0).max(1.0),
                LANE_PX - 3.0,
                color(op.completion),
                op.invoke_index,
                p,
                esc(&op.f),
                esc(op.key.as_deref().unwrap_or("")),
                esc(&op.input.to_string()),
                op.completion,
                esc(&op.output.to_string())
            );
        }
        Self::axis(&mut page, &x, height - 20.0, end_ms);
        page.push_str("</svg>");

        // Latency: log scale, 1 ms .. 100 s.
        let plot_h = PLOT_PX + 60.0;
        let y_of = |ms: f64| {
            let v = ms.clamp(1.0, 100_000.0).log10() / 5.0;
            20.0 + PLOT_PX - v * PLOT_PX
        };
        let _ = write!(
            page,
            "<h2>Latency</h2><p>Completion latency of each operation by its invocation time (log \
             scale); unknown outcomes are drawn at the latency when the client gave up.</p>\
             <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{plot_h}\">"
        );
        Self::shade(&mut page, &nemesis, &x, 30.0, 20.0 + PLOT_PX, end_ms);
        for decade in 0..=5 {
            let ms = 10f64.powi(decade);
            let y = y_of(ms);
            let _ = write!(
                page,
                "<line x1=\"{MARGIN}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"4\" y=\"{:.1}\" font-size=\"10\">{} ms</text>",
                WIDTH - MARGIN,
                y + 3.0,
                ms
            );
        }
        for op in &shown {
            let Some(done) = op.complete_ms else { continue };
            let _ = write!(
                page,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{}\"><title>#{} {} {:.1} ms</title></circle>",
                x(op.invoke_ms),
                y_of(done - op.invoke_ms),
                color(op.completion),
                op.invoke_index,
                esc(&op.f),
                done - op.invoke_ms
            );
        }
        Self::axis(&mut page, &x, 20.0 + PLOT_PX + 20.0, end_ms);
        page.push_str("</svg>");

        page.push_str("<h2>Linearizability per key</h2><table><tr><th>key</th><th>model</th><th>ops</th><th>verdict</th><th>states</th></tr>");
        for k in &results.linearizability {
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&k.key),
                esc(&k.model),
                k.operations,
                esc(&k.verdict),
                k.states
            );
        }
        page.push_str("</table></body></html>\n");
        page
    }

    fn shade(
        page: &mut String,
        nemesis: &[crate::history::NemesisInterval],
        x: &dyn Fn(f64) -> f64,
        top: f64,
        bottom: f64,
        end_ms: f64,
    ) {
        for (i, n) in nemesis.iter().enumerate() {
            let (x0, x1) = (x(n.start_ms), x(n.end_ms.unwrap_or(end_ms)));
            // Alternate label rows so neighbouring faults' names do not overprint.
            let label_y = top - 4.0 - (i % 2) as f64 * 10.0;
            let _ = write!(
                page,
                "<rect x=\"{x0:.1}\" y=\"{top}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#888\" opacity=\"0.18\">\
                 <title>{}</title></rect><text x=\"{x0:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
                (x1 - x0).max(1.0),
                bottom - top,
                esc(&n.fault),
                label_y,
                esc(&n.fault)
            );
        }
    }

    fn axis(page: &mut String, x: &dyn Fn(f64) -> f64, y: f64, end_ms: f64) {
        let tick_s = ((end_ms / 1000.0 / 10.0).ceil()).max(1.0);
        let mut t = 0.0;
        while t * 1000.0 <= end_ms {
            let _ = write!(
                page,
                "<text x=\"{:.1}\" y=\"{y:.1}\" font-size=\"10\">{t}s</text>",
                x(t * 1000.0)
            );
            t += tick_s;
        }
    }
}
