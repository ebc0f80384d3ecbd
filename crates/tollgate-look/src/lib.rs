//! The look of tollgate's charts, kept in one place: the batch runner's
//! `--plot` SVG (drawn with plotters) and the gateway's status page (CSS
//! variables) use these colours and this font, so a chart reads the same in
//! either: the measured series in blue, the limit it is held to in red,
//! on white with a light grid.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// A colour as red, green and blue bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// `#rrggbb`.
    pub fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// The measured series (what was admitted, how full a window is).
pub const SERIES: Rgb = Rgb(0x1f, 0x5f, 0xbf);
/// The limit a series is held to.
pub const LIMIT: Rgb = Rgb(0xcc, 0x22, 0x22);
/// A second series (a queue, tokens beside requests).
pub const SECOND: Rgb = Rgb(0xe0, 0x8a, 0x00);
/// Healthy (a closed circuit, a window with room).
pub const OK: Rgb = Rgb(0x2e, 0x8b, 0x3e);
/// Page and chart background.
pub const BACKGROUND: Rgb = Rgb(0xff, 0xff, 0xff);
/// Panels on the background.
pub const PANEL: Rgb = Rgb(0xf6, 0xf7, 0xf9);
/// Grid lines and borders.
pub const GRID: Rgb = Rgb(0xdd, 0xe1, 0xe6);
/// Text.
pub const TEXT: Rgb = Rgb(0x1d, 0x23, 0x2b);
/// Secondary text (axis labels, captions).
pub const MUTED: Rgb = Rgb(0x5b, 0x65, 0x70);

/// The font family plotters draws with.
pub const FONT: &str = "sans-serif";
/// The same font for CSS, preferring the system's own sans-serif face.
pub const CSS_FONT: &str =
    "system-ui, -apple-system, \"Segoe UI\", Roboto, \"Helvetica Neue\", Arial, sans-serif";
/// Caption size, in pixels.
pub const CAPTION_PX: u32 = 18;
/// Width of a limit line, in pixels (series lines are 1.5 on the page, 1
/// in the SVG).
pub const LIMIT_LINE_PX: u32 = 2;

/// The palette as CSS custom properties (`:root { --series: #...; ... }`),
/// for a page to use with `var(--series)`.
pub fn css_variables() -> String {
    let vars = [
        ("series", SERIES),
        ("limit", LIMIT),
        ("second", SECOND),
        ("ok", OK),
        ("bg", BACKGROUND),
        ("panel", PANEL),
        ("grid", GRID),
        ("text", TEXT),
        ("muted", MUTED),
    ];
    let mut out = String::from(":root{");
    for (name, colour) in vars {
        out.push_str(&format!("--{name}:{};", colour.hex()));
    }
    out.push_str(&format!(
        "--font:{CSS_FONT};--caption:{CAPTION_PX}px;--limit-line:{LIMIT_LINE_PX}px;}}"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn css_names_every_colour_in_hex() {
        let css = css_variables();
        assert!(css.starts_with(":root{") && css.ends_with('}'));
        assert!(css.contains("--series:#1f5fbf;"));
        assert!(css.contains("--limit:#cc2222;"));
        assert!(css.contains("--font:system-ui"));
    }
}
