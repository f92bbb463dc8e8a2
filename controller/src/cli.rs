//! The operator commands, as functions that write to given streams and
//! return an exit code, so tests can drive them without a process.

use std::io::Write;
use std::path::Path;

use baton_proto::RefTime;
use baton_proto::pack::{Pack, read_pack_file};
use baton_proto::plan::plan;
use baton_proto::time::parse_instant_arg;

/// Read and validate one pack file. Errors come back already rendered as
/// `FILE:LINE:COL: message` lines.
pub fn load_pack(path: &Path) -> Result<Pack, String> {
    read_pack_file(path).map(|(_, pack)| pack)
}

/// `validate FILE...`: 0 when every file is valid, 1 otherwise. Reads the
/// wall clock once, here at the CLI edge, for [`Pack::check_live`].
pub fn validate(files: &[std::path::PathBuf], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let now = RefTime::from_timestamp(jiff::Timestamp::now()).unwrap_or(RefTime::MAX);
    validate_at(files, now, out, err)
}

/// `validate` as of `now`: the parse errors and the live checks (crons
/// that can never fire again) of each file, all rendered as
/// `FILE:LINE:COL: message`.
pub fn validate_at(
    files: &[std::path::PathBuf],
    now: RefTime,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let mut code = 0;
    for f in files {
        let checked = load_pack(f).and_then(|p| match p.check_live(now) {
            Ok(()) => Ok(p),
            Err(e) => Err(e.render(&f.display().to_string()).trim_end().to_string()),
        });
        match checked {
            Ok(p) => {
                let _ = writeln!(
                    out,
                    "{}: ok (pack {} version {}, {} instruction{})",
                    f.display(),
                    p.id,
                    p.version,
                    p.instructions.len(),
                    if p.instructions.len() == 1 { "" } else { "s" }
                );
                if let Some(r) = &p.rollout {
                    let _ = writeln!(
                        out,
                        "  rollout: {} stage{}; {}",
                        r.stages.len(),
                        if r.stages.len() == 1 { "" } else { "s" },
                        r.abort_if.describe()
                    );
                }
            }
            Err(rendered) => {
                let _ = writeln!(err, "{rendered}");
                code = 1;
            }
        }
    }
    code
}

/// `plan FILE --from T --count N [--json]`.
pub fn plan_cmd(
    file: &Path,
    from: &str,
    count: usize,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let from = match parse_instant_arg("--from", from) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return 2;
        }
    };
    let pack = match load_pack(file) {
        Ok(p) => p,
        Err(rendered) => {
            let _ = writeln!(err, "{rendered}");
            return 1;
        }
    };
    let firings = plan(&pack, from, count);
    let result = if json {
        write_json(&pack, &firings, out)
    } else {
        write_table(&pack, &firings, out)
    };
    if let Err(e) = result {
        let _ = writeln!(err, "error: writing output: {e}");
        return 1;
    }
    0
}

fn local(pack: &Pack, at: RefTime) -> String {
    let z = at.to_timestamp().to_zoned_datetime(pack.timezone.clone());
    // RFC 3339 with the zone's offset, nanoseconds kept.
    format!("{:.9}", z.timestamp().display_with_offset(z.offset()))
}

fn write_json(
    pack: &Pack,
    firings: &[baton_proto::plan::PlannedFiring],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    for f in firings {
        let line = serde_json::json!({
            "instruction": pack.instructions[f.index].id,
            "at": f.at.to_rfc3339(),
            "local": local(pack, f.at),
        });
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn write_table(
    pack: &Pack,
    firings: &[baton_proto::plan::PlannedFiring],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "pack {} version {} ({}), {} firing{}",
        pack.id,
        pack.version,
        pack.timezone_name,
        firings.len(),
        if firings.len() == 1 { "" } else { "s" }
    )?;
    let width = pack
        .instructions
        .iter()
        .map(|i| i.id.len())
        .max()
        .unwrap_or(0)
        .max("INSTRUCTION".len());
    writeln!(
        out,
        "{:<36}  {:<41}  {:<width$}  ACTION",
        "AT (UTC)", "LOCAL", "INSTRUCTION"
    )?;
    for f in firings {
        let ins = &pack.instructions[f.index];
        writeln!(
            out,
            "{:<36}  {:<41}  {:<width$}  {}",
            f.at.to_rfc3339(),
            local(pack, f.at),
            ins.id,
            ins.action.name()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate_text(text: &str, now: &str) -> (i32, String, String) {
        let dir = std::env::temp_dir().join(format!(
            "baton-controller-validate-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("p.yaml");
        std::fs::write(&file, text).expect("write");
        let now = baton_proto::time::parse_instant_arg("now", now).expect("instant");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = validate_at(&[file], now, &mut out, &mut err);
        let _ = std::fs::remove_dir_all(&dir);
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn validate_refuses_a_cron_of_past_years_as_of_now() {
        let text = "pack: p\nversion: 1\ninstructions:\n  - {id: old, action: noop, cron: \"* * * * * * 2020\"}\n  - {id: gone, action: noop, at: 2021-01-01T00:00:00Z}\n";
        let (code, _, err) = validate_text(text, "2026-12-01T00:00:00Z");
        assert_eq!(code, 1);
        assert!(
            err.contains("p.yaml:4:35: instruction `old`: cron `* * * * * * 2020` can never fire again: it has no firing at or after now (2026-12-01T00:00:00"),
            "{err}"
        );
        // A past one-shot is not refused: it is reported as missed at runtime.
        assert!(!err.contains("gone"), "{err}");
        // The same pack in 2020 is fine.
        let (code, out, err) = validate_text(text, "2020-06-01T00:00:00Z");
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("ok (pack p version 1, 2 instructions)"),
            "{out}"
        );
    }

    /// An operator sees what fails a stage, defaults included, not only
    /// what the file named.
    #[test]
    fn validate_says_what_fails_a_rollout_stage() {
        let text = "pack: p\nversion: 1\ninstructions:\n  - {id: a, action: noop, every: 1s}\nrollout:\n  stages: [{agents: 1}, {percent: 100}]\n  abort_if: {lateness_p99: 1s, unknown: off}\n";
        let (code, out, err) = validate_text(text, "2026-12-01T00:00:00Z");
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("  rollout: 2 stages; a stage fails on failed firings > 0%, lateness p99 > 1s; off: unknown, offset\n"),
            "{out}"
        );
    }
}
