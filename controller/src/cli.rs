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

/// `validate FILE...`: 0 when every file is valid, 1 otherwise.
pub fn validate(files: &[std::path::PathBuf], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut code = 0;
    for f in files {
        match load_pack(f) {
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
