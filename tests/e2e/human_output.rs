//! Regression (issue 36, items 5 and 8): output meant for people was raw.
//! Byte counts came without units in the preflight, `status`, `plan` and
//! the run summary; `run --retire-sources` printed every retired file name
//! on one line; `status` printed the exact bytes beside the sizes; a
//! second `publish` said `11 (0 uploaded, 0 already there)`; on a pulled
//! DIR `audit` called the artifact's files "metadata sources" and `status`
//! listed plan and convert, stages a pull never has, as pending; `verify
//! DIR` (not `DIR/artifact`) failed without a hint; `publish
//! DIR/artifact` failed. Sizes now come from one formatter (exact bytes in
//! `--json`), lists are counts, a pulled DIR is described as one, and
//! `verify` and `publish` take either directory.

use std::path::Path;
use std::process::Output;

use crate::common::s3::*;
use crate::common::*;
use crate::s3::{built, publish, shape};

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The line of `text` starting with `label`.
fn line<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no line {label:?} in\n{text}"))
}

/// Whether `s` ends with a size as the one formatter writes it.
fn ends_with_size(s: &str) -> bool {
    let mut words = s.split_whitespace().rev();
    let (Some(unit), Some(number)) = (words.next(), words.next()) else {
        return false;
    };
    ["B", "kB", "MB", "GB", "TB"].contains(&unit) && number.parse::<f64>().is_ok()
}

/// `run` (retiring sources), `status`, `plan` and `audit` of the result:
/// sizes with units, the retired files counted, their names in `--json`.
#[test]
fn run_status_plan_and_audit_show_sizes_and_counts() {
    let _g = time_bounded();
    let hub = qwen4_hub(361, shape());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    let summary = text(&o);
    assert!(
        ends_with_size(line(&summary, "bytes").trim_end_matches(" (= predicted)")),
        "{summary}"
    );
    let retired = line(&summary, "retired sources");
    assert!(
        retired.contains(" files (deleted once converted;"),
        "{retired}"
    );
    assert!(!retired.contains(".safetensors"), "names listed: {retired}");
    let json = audit_json(&out, false);
    let retired_files = json["retirement"]["retired_files"].as_u64().unwrap();
    assert!(
        retired.starts_with(&format!("retired sources  {retired_files} files")),
        "{retired}"
    );

    let status = text(&run_ok(ftpipe().args(["status", "--out"]).arg(&out)));
    let bytes = line(&status, "bytes");
    assert!(
        bytes.contains(" durable of ") && ends_with_size(bytes.trim_end_matches(" expected")),
        "{bytes}"
    );
    assert!(
        !bytes.contains("bytes)"),
        "exact bytes belong in --json: {bytes}"
    );
    assert!(
        status.contains("stage        convert    completed in run 1"),
        "{status}"
    );

    let mut cmd = ftpipe();
    cmd.args([
        "plan",
        REPO,
        "--remote",
        "--endpoint",
        &hub.endpoint(),
        "--out",
    ])
    .arg(&out);
    let plan = text(&run_ok(&mut cmd));
    let model = line(&plan, "model.ftw");
    assert!(ends_with_size(model), "{model}");
    let total = line(&plan, "total");
    assert!(total.contains(" bytes; exact sizes: --json)"), "{total}");

    let audit = text(&run(ftpipe().args(["audit", "--out"]).arg(&out)));
    for label in ["weight sources (n/size)", "retired sources (n/size)"] {
        assert!(ends_with_size(line(&audit, label)), "{audit}");
    }
    assert!(
        line(&audit, "reconciliation error").ends_with(" 0"),
        "{audit}"
    );
}

/// `verify DIR` checks DIR/artifact; `publish DIR/artifact` publishes DIR
/// and says what it did in words; the second publish says everything is
/// already there; a pulled DIR is shown as one. An artifact copied away
/// from its DIR is refused, saying which directory publish wants.
#[test]
fn verify_and_publish_take_either_dir_and_a_pulled_dir_is_described_as_one() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 362);
    let v = text(&run_ok(ftpipe().arg("verify").arg(&src)));
    assert!(
        line(&v, "artifact").ends_with(&src.join("artifact").display().to_string()),
        "{v}"
    );
    // A DIR with state but no artifact yet says how one is built.
    let fetched = tmp.path().join("fetched");
    std::fs::create_dir_all(fetched.join(".ftpipe")).unwrap();
    let o = run(ftpipe().arg("verify").arg(&fetched));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("no artifact yet") && err.contains("ftpipe run"),
        "{err}"
    );

    let m = Moto::start();
    let dest = "s3://models/words/exp";
    let objects = |o: &Output| line(&text(o), "objects").to_owned();
    let mut cmd = m.ftpipe(home);
    cmd.arg("publish")
        .arg(src.join("artifact"))
        .arg(dest)
        .args(["--part-size", PART_SIZE]);
    let first = run_ok(&mut cmd);
    let uploaded = objects(&first);
    assert!(
        uploaded.ends_with(" uploaded") && !uploaded.contains('('),
        "{uploaded}"
    );
    let n = uploaded.split_whitespace().nth(1).unwrap().to_owned();
    let again = run_ok(m.ftpipe(home).arg("publish").arg(&src).arg(dest));
    assert_eq!(
        objects(&again),
        format!("objects          {n} already there")
    );
    let s = crate::s3::summary(&publish(&m, home, &src, dest));
    assert_eq!(
        s["outcome"]["objects"].as_u64().unwrap().to_string(),
        n,
        "exact in --json"
    );

    let copy = tmp.path().join("copy");
    copy_tree(&src.join("artifact"), &copy);
    let o = run(m.ftpipe(home).arg("publish").arg(&copy).arg(dest));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is an artifact, not a DIR that holds one"),
        "{}",
        stderr(&o)
    );
    assert!(!copy.join(".ftpipe").exists(), "state created in the copy");

    let pulled = tmp.path().join("pulled");
    run_ok(m.ftpipe(home).args(["pull", dest, "--out"]).arg(&pulled));
    pulled_dir_is_described_as_one(&pulled);
}

fn pulled_dir_is_described_as_one(pulled: &Path) {
    let status = text(&run_ok(ftpipe().args(["status", "--out"]).arg(pulled)));
    assert!(
        status.contains("stage        fetch      completed"),
        "{status}"
    );
    assert!(
        !status.contains("plan ") && !status.contains("convert "),
        "{status}"
    );
    let audit = text(&run(ftpipe().args(["audit", "--out"]).arg(pulled)));
    assert!(
        ends_with_size(line(&audit, "artifact files (n/size)")),
        "{audit}"
    );
    assert!(!audit.contains("sources"), "{audit}");
}
