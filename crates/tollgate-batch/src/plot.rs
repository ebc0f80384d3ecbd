//! `--plot PATH.svg`: what was admitted over the run against the quota
//! lines. For each dimension with a limit, the amount of the attempts
//! started in the trailing window (the quantity the limit bounds) is drawn
//! against the limit; without a limit, per second. Colours and font are
//! `tollgate-look`'s, shared with the gateway's status page.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use tollgate::Dimension;
use tollgate::config::Limit;
use tollgate_look as look;

fn colour(c: look::Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

/// Writes the plot of `starts` (attempt start since the run began, tokens
/// charged) under `limits` to `path`.
///
/// # Errors
/// A message when the SVG cannot be drawn or written.
pub fn write(
    path: &Path,
    starts: &[(Duration, u64)],
    limits: &[Limit],
    wall: Duration,
) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 640)).into_drawing_area();
    root.fill(&colour(look::BACKGROUND))
        .map_err(|e| e.to_string())?;
    let panels = root.split_evenly((2, 1));
    let end = wall.as_secs_f64().max(0.001);
    // Two panels: requests and total tokens. The run records each start's
    // total only, so input/output token limits (SPEC Q-12) are not drawn.
    for (panel, dimension) in panels.iter().zip([Dimension::Requests, Dimension::Tokens]) {
        // The shortest window of the dimension is the one that binds first.
        let limit = limits
            .iter()
            .filter(|l| l.dimension == dimension)
            .min_by_key(|l| l.window);
        let window = limit.map_or(Duration::from_secs(1), |l| l.window);
        let series = trailing(starts, dimension, window, end);
        let top = series
            .iter()
            .map(|&(_, v)| v)
            .chain(limit.map(|l| l.amount as f64))
            .fold(1.0_f64, f64::max)
            * 1.1;
        let what = dimension.as_str();
        let caption = match limit {
            Some(l) => format!(
                "{what} started in the trailing {} (limit {})",
                l.window_label(),
                l.amount
            ),
            None => format!("{what} started per second (no limit)"),
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(
                caption,
                (look::FONT, look::CAPTION_PX)
                    .into_font()
                    .color(&colour(look::TEXT)),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..end, 0.0..top)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .light_line_style(colour(look::GRID).mix(0.5))
            .bold_line_style(colour(look::GRID))
            .axis_style(colour(look::MUTED))
            .label_style((look::FONT, 12).into_font().color(&colour(look::MUTED)))
            .x_desc("seconds since start")
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(LineSeries::new(
                series,
                colour(look::SERIES).stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        if let Some(l) = limit {
            let amount = l.amount as f64;
            chart
                .draw_series(LineSeries::new(
                    [(0.0, amount), (end, amount)],
                    colour(look::LIMIT).stroke_width(look::LIMIT_LINE_PX),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    root.present().map_err(|e| e.to_string())
}

/// The amount started in `(t - window, t]` at up to 1,000 sample points.
fn trailing(
    starts: &[(Duration, u64)],
    dimension: Dimension,
    window: Duration,
    end: f64,
) -> Vec<(f64, f64)> {
    let w = window.as_secs_f64();
    let step = (end / 1000.0).max(w / 50.0).max(0.001);
    // Starts carry their total tokens only (see `write`).
    let amount = |&(_, tokens): &(Duration, u64)| match dimension {
        Dimension::Requests => 1.0,
        Dimension::Tokens | Dimension::InputTokens | Dimension::OutputTokens => tokens as f64,
        Dimension::Cost => 0.0,
    };
    let mut out = Vec::new();
    let (mut lo, mut hi, mut sum) = (0usize, 0usize, 0.0_f64);
    let mut t = 0.0;
    while t <= end + step / 2.0 {
        while let Some(s) = starts.get(hi).filter(|s| s.0.as_secs_f64() <= t) {
            sum += amount(s);
            hi += 1;
        }
        while let Some(s) = starts.get(lo).filter(|s| s.0.as_secs_f64() <= t - w) {
            sum -= amount(s);
            lo += 1;
        }
        out.push((t, sum.max(0.0)));
        t += step;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_sums_and_svg() {
        let s = |ms: u64, t: u64| (Duration::from_millis(ms), t);
        let starts = [s(0, 10), s(100, 10), s(1_100, 5)];
        let series = trailing(&starts, Dimension::Tokens, Duration::from_secs(1), 2.0);
        let at = |t: f64| {
            series
                .iter()
                .find(|(x, _)| (*x - t).abs() < 1e-9 || *x > t)
                .map(|p| p.1)
        };
        assert_eq!(at(0.5), Some(20.0));
        assert_eq!(at(1.2), Some(5.0));
        let path = std::env::temp_dir().join(format!("tollgate-plot-{}.svg", std::process::id()));
        let limits = [Limit::new(Dimension::Tokens, 20, Duration::from_secs(1))];
        write(&path, &starts, &limits, Duration::from_secs(2)).expect("svg");
        let svg = std::fs::read_to_string(&path).expect("svg");
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("tokens started"));
        let _ = std::fs::remove_file(&path);
    }
}
