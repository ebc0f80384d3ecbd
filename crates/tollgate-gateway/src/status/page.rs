//! The status page's HTML: one self-contained document (inline CSS,
//! script and SVG; nothing loaded from elsewhere) whose colours and font
//! come from `tollgate-look`, shared with the batch runner's `--plot`.

use std::sync::OnceLock;

/// The page, with `/*LOOK*/` still to be replaced by the palette.
const TEMPLATE: &str = include_str!("page.html");

/// The status page's HTML.
pub fn page() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| TEMPLATE.replacen("/*LOOK*/", &tollgate_look::css_variables(), 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: OBS-6 (self-contained: nothing is fetched from elsewhere)
    #[test]
    fn page_is_self_contained() {
        let html = page();
        assert!(html.contains("--series:"), "the shared palette is inlined");
        for external in [
            "http://", "https://", "//cdn", "<link", "src=", "@import", "url(",
        ] {
            // The SVG namespace is a name, not a fetch.
            let found = html
                .match_indices(external)
                .filter(|(i, _)| !html[*i..].starts_with("http://www.w3.org/2000/svg"))
                .count();
            assert_eq!(found, 0, "the page refers to {external}");
        }
    }
}
