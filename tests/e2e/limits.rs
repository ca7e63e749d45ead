//! Everything read from outside is bounded. The landed binary had a
//! per-page limit on the listing but no total: 210 MB over 200 pages was
//! accepted at 767 MB RSS, and endless pages stopped at `MAX_FILES` only
//! after 1 GB served and 2 GB RSS. `verify` read a 100 MB `manifest.json`
//! whole (an unknown 100 MB field, or whitespace) and said OK.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;
use serde_json::json;

/// Runs `cmd` to its end, sampling the child's peak RSS (`VmHWM`) until it
/// exits. Returns the output and the last peak seen, in bytes.
fn run_measuring_rss(cmd: &mut std::process::Command) -> (Output, u64) {
    let mut peak = 0u64;
    let (o, _) = run_watched(
        cmd,
        Duration::from_secs(300),
        Duration::from_millis(5),
        |pid| {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kb) = s
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kb * 1024);
            }
        },
    );
    (o, peak)
}

/// One tree page of `n` valid file entries with long paths (~1 MiB).
fn tree_page(page: usize, n: usize) -> String {
    let pad = "p".repeat(200);
    let entries: Vec<_> = (0..n)
        .map(|i| {
            json!({
                "type": "file",
                "path": format!("d{page}/{pad}{i}.bin"),
                "oid": RAW_OID,
                "size": 1,
            })
        })
        .collect();
    serde_json::Value::Array(entries).to_string()
}

#[test]
fn endless_listing_pages_stop_at_the_total_limit_with_bounded_memory() {
    let page = tree_page(0, 3500);
    assert!(page.len() > 900_000, "{}", page.len());
    let srv = RawServer::start(1000, move |target| {
        if target.starts_with(&format!("/api/models/{REPO}/revision/")) {
            RawResponse::new(200, json!({ "sha": RAW_COMMIT }).to_string())
        } else if let Some(rest) =
            target.strip_prefix(&format!("/api/models/{REPO}/tree/{RAW_COMMIT}"))
        {
            // Every page links to another: the listing never ends. Paths
            // differ per page so no entry is "listed twice".
            let n: usize = rest
                .split("page=")
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let body = page.replace("\"d0/", &format!("\"d{n}/"));
            RawResponse::new(200, body).header(
                "Link",
                &format!(
                    "</api/models/{REPO}/tree/{RAW_COMMIT}?recursive=true&page={}>; rel=\"next\"",
                    n + 1
                ),
            )
        } else {
            RawResponse::new(404, "nope")
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (o, peak) = run_measuring_rss(&mut fetch_cmd(&srv.endpoint, &dir.path().join("out"), &[]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("MAX_LISTING_BYTES"), "{err}");
    let pages = srv
        .targets()
        .iter()
        .filter(|t| t.contains("/tree/"))
        .count();
    // 64 MiB over ~1 MiB pages: the listing stops at the total, not at
    // MAX_FILES or MAX_TREE_PAGES.
    assert!((60..=75).contains(&pages), "{pages} pages requested");
    eprintln!("{pages} pages, peak RSS {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(peak > 0, "RSS not measured");
}

#[test]
fn listing_size_errors_name_the_entry() {
    for (size, shown) in [
        ("-1", "size -1 "),
        ("18446744073709551616", "size 1.8446744073709552e+19 "),
        ("1.5", "size 1.5 "),
    ] {
        let tree = format!(
            r#"[{{"type":"file","path":"good.json","oid":"{RAW_OID}","size":1}},
                {{"type":"file","path":"sub/bad.bin","oid":"{RAW_OID}","size":{size}}}]"#
        );
        let srv = RawServer::start(10, move |target| {
            if target.starts_with(&format!("/api/models/{REPO}/revision/")) {
                RawResponse::new(200, json!({ "sha": RAW_COMMIT }).to_string())
            } else if target.starts_with(&format!("/api/models/{REPO}/tree/")) {
                RawResponse::new(200, tree.clone())
            } else {
                RawResponse::new(404, "nope")
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let o = run(&mut fetch_cmd(&srv.endpoint, &dir.path().join("out"), &[]));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("\"sub/bad.bin\""), "{err}");
        assert!(err.contains(shown), "{err}");
        assert!(err.contains("is not an unsigned 64-bit integer"), "{err}");
    }
}

/// A converted artifact (fetched and converted once, copied per case).
fn converted(out: &Path) {
    let hub = qwen4_hub(1301, QwenShape::default());
    run_ok(&mut run_cmd(&hub.endpoint(), out, &[]));
}

fn verify(artifact: &Path) -> Output {
    run(ftpipe().arg("verify").arg(artifact))
}

#[test]
fn verify_refuses_an_oversize_or_unknown_field_manifest_and_placement() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    converted(&base);
    let art = base.join("artifact");
    let o = verify(&art);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(art.join("manifest.json")).unwrap()).unwrap();
    let placement: serde_json::Value =
        serde_json::from_slice(&std::fs::read(art.join("placement.json")).unwrap()).unwrap();

    let case = |name: &str, file: &str, bytes: Vec<u8>, needles: &[&str]| {
        let dir = tmp.path().join(name);
        copy_tree(&art, &dir);
        std::fs::write(dir.join(file), bytes).unwrap();
        let o = verify(&dir);
        let err = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!o.status.success(), "{name}: verify passed:\n{err}");
        assert!(!err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{name}: output lacks {n:?}:\n{err}");
        }
    };

    // An unknown top-level field, and one inside a component.
    let mut m = manifest.clone();
    m["extra"] = json!("hidden");
    case(
        "unknown_top",
        "manifest.json",
        serde_json::to_vec(&m).unwrap(),
        &["manifest.json", "unknown field `extra`"],
    );
    let mut m = manifest.clone();
    m["components"][0]["note"] = json!(1);
    case(
        "unknown_component",
        "manifest.json",
        serde_json::to_vec(&m).unwrap(),
        &["manifest.json", "unknown field `note`"],
    );
    let mut p = placement.clone();
    p["extra"] = json!(true);
    case(
        "unknown_placement",
        "placement.json",
        serde_json::to_vec(&p).unwrap(),
        &["placement.json", "unknown field `extra`"],
    );

    // Over the limit: valid JSON padded with whitespace, refused by size
    // before it is read.
    let mut big = serde_json::to_vec(&manifest).unwrap();
    big.resize(100 << 20, b' ');
    case(
        "oversize",
        "manifest.json",
        big,
        &["manifest.json", "over the limit of"],
    );
    let mut big = serde_json::to_vec(&placement).unwrap();
    big.resize(100 << 20, b' ');
    case(
        "oversize_placement",
        "placement.json",
        big,
        &["placement.json", "over the limit of"],
    );
}
