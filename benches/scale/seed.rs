//! The text the scale bench's seed mode (`TPCSI_SCALE_SEED=lvm-metadata`)
//! writes: thin LV sections for a `vgcfgbackup` file, made from a section
//! LVM wrote for a volume the driver created, and thin device entries for
//! a `thin_dump` of the pool's metadata. Pure functions on text; the
//! bench runs the commands (`benches/scale.rs`); `tests/scale_seed.rs`
//! tests these on the host.

/// LVM's id alphabet is letters, digits, `!` and `#`; these ids use
/// letters and digits only, with a prefix no random id is likely to have.
const ID_PREFIX: &str = "tpcsiSEED";

/// A unique LVM id for the `n`th seeded LV: 32 characters in LVM's
/// 6-4-4-4-4-4-6 form.
pub fn lvm_id(n: u64) -> String {
    let raw = format!("{ID_PREFIX}{n:023}");
    assert_eq!(raw.len(), 32, "seed id {n} does not fit");
    let mut out = String::with_capacity(38);
    let mut at = 0;
    for (k, len) in [6, 4, 4, 4, 4, 4, 6].into_iter().enumerate() {
        if k > 0 {
            out.push('-');
        }
        out.push_str(&raw[at..at + len]);
        at += len;
    }
    out
}

/// The byte range of the section that starts at `start` (a line ending
/// in `{`) up to and including the line of its closing brace. Quoted
/// strings and `#` comments are skipped.
fn section_end(text: &str, start: usize) -> Option<usize> {
    let b = text.as_bytes();
    let (mut depth, mut i) = (0usize, start);
    let (mut quoted, mut comment) = (false, false);
    while i < b.len() {
        let c = b[i];
        if comment {
            comment = c != b'\n';
        } else if quoted {
            if c == b'\\' {
                i += 1;
            } else if c == b'"' {
                quoted = false;
            }
        } else {
            match c {
                b'"' => quoted = true,
                b'#' => comment = true,
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        let eol = text[i..].find('\n').map_or(b.len(), |n| i + n + 1);
                        return Some(eol);
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    None
}

/// Where the line `name {` starts at or after `from`, as LVM writes a
/// section head (indented, alone on its line).
fn section_start(text: &str, from: usize, name: &str) -> Option<usize> {
    let head = format!("{name} {{");
    let mut at = from;
    for line in text[from..].split_inclusive('\n') {
        if line.trim() == head {
            return Some(at);
        }
        at += line.len();
    }
    None
}

/// The byte range of the `logical_volumes` block of a VG backup.
fn logical_volumes(backup: &str) -> Option<(usize, usize)> {
    let start = section_start(backup, 0, "logical_volumes")?;
    Some((start, section_end(backup, start)?))
}

/// The text of LV `name` in a `vgcfgbackup` file: its head line to its
/// closing brace's line.
pub fn lv_section<'a>(backup: &'a str, name: &str) -> Option<&'a str> {
    let (lvs, lvs_end) = logical_volumes(backup)?;
    let head_end = lvs + backup[lvs..].find('\n')? + 1;
    let start = section_start(&backup[..lvs_end], head_end, name)?;
    Some(&backup[start..section_end(backup, start)?])
}

/// LVM's text for a string: quotes, with `"` and `\` escaped.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A thin LV to write, in the shape of a template LVM wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinLv<'a> {
    pub name: &'a str,
    pub id: &'a str,
    pub tags: &'a [String],
    pub device_id: u64,
    pub transaction_id: u64,
    /// A snapshot's origin (the template must be a snapshot's too).
    pub origin: Option<&'a str>,
}

/// `template` (an [`lv_section`] of a thin LV) with the name, id, tags,
/// device id, transaction id and origin of `lv`; everything else (status,
/// flags, creation time and host, size, pool) as the template has it.
/// Panics when the template lacks one of the keys to replace, or has an
/// origin where `lv` has none or the other way round.
pub fn thin_section(template: &str, lv: &ThinLv) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut seen = [false; 5];
    for (n, line) in template.split_inclusive('\n').enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let eol = if line.ends_with('\n') { "\n" } else { "" };
        let key = body.split(" = ").next().unwrap_or("");
        let value = match key {
            _ if n == 0 => {
                out.push_str(&format!("{indent}{} {{{eol}", lv.name));
                continue;
            }
            "id" => (0, quoted(lv.id)),
            "tags" => (
                1,
                format!(
                    "[{}]",
                    lv.tags
                        .iter()
                        .map(|t| quoted(t))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            "device_id" => (2, lv.device_id.to_string()),
            "transaction_id" => (3, lv.transaction_id.to_string()),
            "origin" => (
                4,
                quoted(lv.origin.expect("a snapshot template for a volume")),
            ),
            _ => {
                out.push_str(line);
                continue;
            }
        };
        assert!(!seen[value.0], "{key} twice in the template:\n{template}");
        seen[value.0] = true;
        out.push_str(&format!("{indent}{key} = {}{eol}", value.1));
    }
    assert!(
        seen[..4].iter().all(|s| *s),
        "the template lacks an id, tags, device_id or transaction_id:\n{template}"
    );
    assert_eq!(
        seen[4],
        lv.origin.is_some(),
        "the template and the LV disagree on being a snapshot:\n{template}"
    );
    out
}

/// `backup` with `sections` (each from [`thin_section`]) added at the
/// end of its `logical_volumes`, a blank line before each as LVM writes.
pub fn with_lvs(backup: &str, sections: &[String]) -> String {
    let (_, end) = logical_volumes(backup).expect("a logical_volumes block");
    // The block's closing brace is on the last line of the range.
    let close = backup[..end - 1].rfind('\n').map_or(0, |n| n + 1);
    let added: usize = sections.iter().map(|s| s.len() + 1).sum();
    let mut out = String::with_capacity(backup.len() + added);
    out.push_str(&backup[..close]);
    for s in sections {
        out.push('\n');
        out.push_str(s);
    }
    out.push_str(&backup[close..]);
    out
}

/// The `transaction_id` line of thin pool `pool`'s segment: its range and
/// value. Panics when the pool has pending messages (LVM has not yet sent
/// them to the kernel: its figure is not the kernel's).
fn pool_transaction_at(backup: &str, pool: &str) -> (usize, usize, u64) {
    let section = lv_section(backup, pool).expect("the pool's section");
    let base = section.as_ptr() as usize - backup.as_ptr() as usize;
    assert!(
        !section.contains("message1 {"),
        "the pool has pending messages:\n{section}"
    );
    let mut at = base;
    for line in section.split_inclusive('\n') {
        if let Some(v) = line.trim().strip_prefix("transaction_id = ") {
            return (at, at + line.len(), v.parse().expect("a transaction id"));
        }
        at += line.len();
    }
    panic!("no transaction_id in the pool's section:\n{section}");
}

/// Thin pool `pool`'s transaction id in a VG backup.
pub fn pool_transaction(backup: &str, pool: &str) -> u64 {
    pool_transaction_at(backup, pool).2
}

/// `backup` with thin pool `pool`'s transaction id set to `id`.
pub fn with_pool_transaction(backup: &str, pool: &str, id: u64) -> String {
    let (start, end, _) = pool_transaction_at(backup, pool);
    let line = &backup[start..end];
    let indent = &line[..line.len() - line.trim_start().len()];
    format!(
        "{}{indent}transaction_id = {id}\n{}",
        &backup[..start],
        &backup[end..]
    )
}

/// The `<superblock ...>` element's head in a `thin_dump`.
fn superblock(xml: &str) -> (usize, usize) {
    let start = xml.find("<superblock ").expect("a superblock");
    let end = start + xml[start..].find('>').expect("the superblock's end");
    (start, end)
}

/// Attribute `name` of the superblock in a `thin_dump`, as a number.
pub fn superblock_attr(xml: &str, name: &str) -> u64 {
    let (start, end) = superblock(xml);
    attr(&xml[start..end], name).unwrap_or_else(|| panic!("no {name} in the superblock"))
}

fn attr(element: &str, name: &str) -> Option<u64> {
    let key = format!(" {name}=\"");
    let at = element.find(&key)? + key.len();
    let len = element[at..].find('"')?;
    element[at..at + len].parse().ok()
}

/// The thin device ids a `thin_dump` holds.
pub fn device_ids(xml: &str) -> Vec<u64> {
    xml.match_indices("<device ")
        .map(|(at, _)| {
            let end = at + xml[at..].find('>').expect("a device's end");
            attr(&xml[at..end], "dev_id").expect("a dev_id")
        })
        .collect()
}

/// A `thin_dump` with empty thin devices `ids` added (no mapped blocks,
/// made in the superblock's time) and its transaction set to
/// `transaction`, for `thin_restore`.
pub fn with_thin_devices(xml: &str, ids: &[u64], transaction: u64) -> String {
    let (start, end) = superblock(xml);
    let head = &xml[start..end];
    let time = attr(head, "time").expect("a time in the superblock");
    let old = attr(head, "transaction").expect("a transaction in the superblock");
    let head = head.replacen(
        &format!(" transaction=\"{old}\""),
        &format!(" transaction=\"{transaction}\""),
        1,
    );
    let close = xml.rfind("</superblock>").expect("the superblock's close");
    let mut out = String::with_capacity(xml.len() + ids.len() * 120);
    out.push_str(&xml[..start]);
    out.push_str(&head);
    out.push_str(&xml[end..close]);
    for id in ids {
        out.push_str(&format!(
            "  <device dev_id=\"{id}\" mapped_blocks=\"0\" transaction=\"{transaction}\" \
             creation_time=\"{time}\" snap_time=\"{time}\">\n  </device>\n"
        ));
    }
    out.push_str(&xml[close..]);
    out
}
