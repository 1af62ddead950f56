//! What the host's processes hold: their environments and memory, scanned for a value that
//! must never reach them (egress injection's tests).

/// Host pids whose environment holds `needle`.
pub fn pids_with_env(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if memchr_find(&env, needle.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

pub fn memchr_find(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

/// Largest mapping read when scanning a process's memory: heaps and stacks are far smaller,
/// and a runtime's reserved-but-untouched regions are not worth gigabytes of reads.
const MAPPING_BYTES_MAX: u64 = 256 << 20;
/// Bytes read at a time from `/proc/{pid}/mem`.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Whether any readable mapping of `pid`'s memory holds `needle`, read in chunks that overlap
/// by the needle's length.
pub fn memory_holds(pid: u32, needle: &[u8]) -> bool {
    memory_holds_within(pid, needle, MAPPING_BYTES_MAX)
}

/// [`memory_holds`], reading up to `mapping_bytes_max` of each mapping (a guest's RAM is one
/// mapping of QEMU's, as large as the guest's memory).
pub fn memory_holds_within(pid: u32, needle: &[u8], mapping_bytes_max: u64) -> bool {
    use std::os::unix::fs::FileExt as _;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return false;
    };
    let mut buf = vec![0u8; READ_CHUNK_BYTES + needle.len()];
    for line in maps.lines() {
        let mut words = line.split_whitespace();
        let (Some(range), Some(perms)) = (words.next(), words.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let end = b.min(a + mapping_bytes_max);
        let mut at = a;
        while at < end {
            let want = ((end - at) as usize).min(buf.len());
            match mem.read_at(&mut buf[..want], at) {
                Ok(n) if n > 0 => {
                    if memchr_find(&buf[..n], needle) {
                        return true;
                    }
                    at += READ_CHUNK_BYTES as u64;
                }
                _ => break,
            }
        }
    }
    false
}

/// The processes holding an egress placeholder (`whose`, a sandbox's: no other process has
/// one) hold `secret` nowhere in their memory; at least one such process exists.
pub fn assert_placeholder_holders_lack(secret: &[u8], whose: &str) {
    let sandboxed = pids_with_env("sqd_egress_");
    assert!(
        !sandboxed.is_empty(),
        "no process of {whose} holds the placeholder"
    );
    for pid in &sandboxed {
        assert!(
            !memory_holds(*pid, secret),
            "process {pid} of {whose} holds the value in its memory"
        );
    }
}
