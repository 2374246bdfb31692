//! The report's PNG: one horizontal bar panel per benchmark (median, whisker min–max).

use mbx_testbed::bench::{self, med};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use crate::Res;

const ROW_PX: u32 = 20;
const PANEL_EXTRA_PX: u32 = 80;

/// (label, median, min, max)
type Row = (String, f64, f64, f64);

fn row(label: String, v: &Value) -> Row {
    (
        label,
        med(v),
        v["min"].as_f64().unwrap_or(0.0),
        v["max"].as_f64().unwrap_or(0.0),
    )
}

pub fn plot(report: &Value, path: &std::path::Path) -> Res<()> {
    let mut hs = Vec::new();
    for c in report["handshake"]["results"]["TLS 1.3"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for r in c["roles"].as_array().into_iter().flatten() {
            let label = format!(
                "{}: {}",
                c["config"].as_str().unwrap_or(""),
                r["role"].as_str().unwrap_or("")
            );
            hs.push(row(label, &r["cpu_us"]));
        }
    }
    let relay = &report["relay"];
    let rl: Vec<Row> = [
        ("openssl speed AES-256-GCM (1 pass)", "openssl_speed"),
        ("aws-lc-rs AES-256-GCM seal (1 pass)", "aead_seal"),
        ("in-process relay decrypt+re-encrypt", "in_process_dec_enc"),
        ("in-process forward-only (copy)", "in_process_forward"),
        ("TCP middlebox decrypt+re-encrypt", "tcp_dec_enc"),
        ("TCP relay forward-only", "tcp_forward"),
    ]
    .iter()
    .map(|(l, k)| row(l.to_string(), &relay[format!("{k}_mb_per_cpu_s")]))
    .collect();
    let mut fe = Vec::new();
    for v in ["TLS 1.3", "TLS 1.2"] {
        let f = &report["fetch"][v];
        fe.push(row(
            format!("{v} TLS via TCP relay"),
            &f["tls_via_tcp_relay_ms"],
        ));
        fe.push(row(format!("{v} mbTLS, 1 middlebox"), &f["mbtls_ms"]));
    }
    let panels = [
        (
            "handshake CPU per role, TLS 1.3, µs (median, whisker min-max)",
            hs,
        ),
        (
            "relay throughput, MB per CPU-second of the middlebox (16 KB records)",
            rl,
        ),
        ("fetch time of a 1 KB object, 2 hops of 20 ms RTT, ms", fe),
    ];
    let heights: Vec<u32> = panels
        .iter()
        .map(|(_, r)| PANEL_EXTRA_PX + ROW_PX * r.len() as u32)
        .collect();
    let root = BitMapBackend::new(path, (1200, heights.iter().sum())).into_drawing_area();
    root.fill(&WHITE)?;
    if let Some(font) = bench::sans_font() {
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "font")?;
    }
    let mut rest = root.clone();
    for ((title, rows), h) in panels.iter().zip(heights) {
        let (area, below) = rest.split_vertically(h);
        bars(&area, title, rows)?;
        rest = below;
    }
    root.present()?;
    Ok(())
}

fn bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, rows: &[Row]) -> Res<()>
where
    DB::ErrorType: 'static,
{
    let max = rows.iter().map(|r| r.3).fold(1e-9, f64::max) * 1.05;
    let (left, right) = area.split_horizontally(430);
    let n = rows.len() as i32;
    let label_style = ("sans-serif", 13).into_font();
    let mut chart = ChartBuilder::on(&right)
        .caption(title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(25)
        .build_cartesian_2d(0.0..max, 0.0..n as f64)
        .map_err(|e| e.to_string())?;
    let _ = chart.configure_mesh().disable_y_mesh().draw();
    let base_y = left.get_base_pixel().1;
    for (i, r) in rows.iter().enumerate() {
        let y = (n - 1 - i as i32) as f64;
        // Labels on the left, level with their bar's centre.
        let py = chart.backend_coord(&(0.0, y + 0.5)).1 - base_y - 7;
        let _ = left.draw(&Text::new(r.0.clone(), (6, py), label_style.clone()));
        let baseline = [
            "TLS via",
            "plain TLS",
            "split",
            "openssl",
            "aws-lc-rs",
            "forward",
        ];
        let color = if baseline.iter().any(|b| r.0.contains(b)) {
            BLUE.mix(0.5)
        } else {
            RED.mix(0.6)
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.15), (r.1, y + 0.85)],
                color.filled(),
            )))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(r.2, y + 0.5), (r.3, y + 0.5)],
                BLACK.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
