//! `replay --html` writes one self-contained page whose figures are the
//! text report's, and which a browser renders: headless Chromium (where
//! `.ci/run` could install it) runs its script, and the rendered DOM holds
//! the peak figures and the allocations live at the peak.

use std::path::{Path, PathBuf};
use std::process::Command;

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_streamalloc"))
        .args(args)
        .output()
        .unwrap()
}

/// The torch fixtures, and the real snapshots where `shared/` is beside
/// the checkout (as on a developer's machine and in CI).
fn snapshots() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found: Vec<PathBuf> = ["expandable", "mid_run", "two_devices"]
        .iter()
        .map(|name| root.join(format!("tests/fixtures/torch/{name}.pickle")))
        .collect();
    if let Ok(dir) = std::fs::read_dir(root.join("../shared/torch-h200")) {
        let mut real: Vec<PathBuf> = dir
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
            .collect();
        real.sort();
        found.extend(real);
    }
    found
}

/// A browser that can dump the DOM it rendered, if one is installed.
fn browser() -> Option<&'static str> {
    ["chromium-headless-shell", "chromium", "chromium-browser"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|out| out.status.success())
        })
}

/// The text report's figure after `label ` on its last line that has it
/// (the total's line, where there are several devices).
fn figure(text: &str, label: &str) -> String {
    let line = text
        .lines()
        .rev()
        .find(|line| line.contains(label) && !line.contains("stream "))
        .unwrap_or_else(|| panic!("no {label:?} in {text}"));
    let after = &line[line.find(label).unwrap() + label.len()..];
    after.split(',').next().unwrap().trim().to_string()
}

#[test]
fn the_page_holds_the_reports_figures_and_renders() {
    let dir = std::env::temp_dir().join(format!("streamalloc-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let browser = browser();
    if browser.is_none() {
        eprintln!(
            "skipped the rendering half: no headless Chromium here (.ci/run installs Debian's chromium-headless-shell)"
        );
    }
    for snapshot in snapshots() {
        let name = snapshot.file_name().unwrap().to_string_lossy().into_owned();
        let page = dir.join(format!("{name}.html"));
        let out = cli(&[
            "replay",
            snapshot.to_str().unwrap(),
            "--html",
            page.to_str().unwrap(),
            "--quiet",
        ]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let peak_live = figure(&text, "peak live");
        let peak_reserved = figure(&text, "peak reserved");
        let in_trace = figure(&text, "of which up to the trace's last event:");
        let in_trace = in_trace.split_whitespace().next().unwrap().to_string();
        let html = std::fs::read_to_string(&page).unwrap();
        // The settings it went by, defaults filled in.
        assert!(
            html.contains("Settings: virtual storage, expandable pools, budget none, headroom 1 %"),
            "{name}: no settings note"
        );
        // Self-contained: nothing fetched from anywhere.
        for external in ["src=\"http", "href=\"http", "@import", "<link"] {
            assert!(!html.contains(external), "{name}: {external}");
        }
        for (id, value) in [
            ("peak-live", &peak_live),
            ("peak-reserved", &peak_reserved),
            ("driver-in-trace", &in_trace),
        ] {
            let fact = format!("id=\"fact-{id}\">{value}<");
            assert!(html.contains(&fact), "{name}: {fact} not in the page");
        }
        // The driver's time by path: the text report's (first) device's
        // line, row by row in the page's table.
        let by_path = text
            .lines()
            .find_map(|line| Some(line.split_once("by path, us per event: ")?.1))
            .unwrap_or_else(|| panic!("{name}: no by-path line"));
        let table = &html[html.find("Driver time by path").expect("the by-path table")..];
        for cost in by_path.split(", ") {
            let (path, value) = cost.split_once(' ').unwrap();
            let row = &table[table.find(&format!("<td>{path}</td>")).unwrap()..];
            let row = &row[..row.find("</tr>").unwrap()];
            assert!(
                row.contains(&format!("<td>{value}</td>")),
                "{name}: {path} {value} in {row}"
            );
        }
        let Some(browser) = browser else { continue };
        let dom = Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--dump-dom",
                &format!("file://{}", page.display()),
            ])
            .output()
            .unwrap();
        let dom = String::from_utf8_lossy(&dom.stdout);
        for (id, value) in [("peak-live", &peak_live), ("peak-reserved", &peak_reserved)] {
            let fact = format!("id=\"fact-{id}\">{value}<");
            assert!(
                dom.contains(&fact),
                "{name}: {fact} not in the rendered page"
            );
        }
        // The script ran: the chart is drawn and the peak's allocations
        // are listed, largest first.
        assert!(dom.contains("<polyline"), "{name}: no chart drawn");
        assert!(
            dom.contains("Live allocations at the peak"),
            "{name}: the peak is not shown"
        );
        assert!(dom.contains("<td>1</td>"), "{name}: no allocation listed");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
