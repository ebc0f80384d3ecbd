//! W3C trace context by hand (SPEC OBS-5): the `traceparent` a client
//! sends, parsed; the one each attempt sends upstream, written; the
//! `tracestate` passed through; new ids; and the sampling decision of
//! OpenTelemetry's `ParentBased(TraceIdRatioBased(ratio))`, which this
//! crate used before it had its own spans.

use std::sync::Arc;

use rand::Rng;

/// The trace a client's valid `traceparent` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parent {
    /// The trace's id (never all zeros).
    pub trace_id: [u8; 16],
    /// The client's span, the call span's parent (never all zeros).
    pub span_id: [u8; 8],
    /// The client's `sampled` flag.
    pub sampled: bool,
}

/// The `traceparent` of `value` if it is valid per W3C Trace Context:
/// version `00` is exactly 55 characters (`00-<32 hex>-<16 hex>-<2 hex>`),
/// lowercase hex only, neither id all zeros; a later version (not `ff`)
/// is read the same way from its first 55 characters, which must be all
/// of it or be followed by `-`. Only the `sampled` flag is kept.
pub(crate) fn parse_traceparent(value: &str) -> Option<Parent> {
    let b = value.trim().as_bytes();
    if b.len() < 55 {
        return None;
    }
    let version = hex_byte(&b[0..2])?;
    match version {
        0x00 if b.len() != 55 => return None,
        0xff => return None,
        _ => {}
    }
    if b.len() > 55 && b[55] != b'-' {
        return None;
    }
    if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let mut trace_id = [0_u8; 16];
    for (i, byte) in trace_id.iter_mut().enumerate() {
        *byte = hex_byte(&b[3 + 2 * i..5 + 2 * i])?;
    }
    let mut span_id = [0_u8; 8];
    for (i, byte) in span_id.iter_mut().enumerate() {
        *byte = hex_byte(&b[36 + 2 * i..38 + 2 * i])?;
    }
    let flags = hex_byte(&b[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(*two.first()?)? << 4 | digit(*two.get(1)?)?)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The `traceparent` (version `00`) of a span: its trace, its id and
/// `01` if it is sampled, else `00`.
pub(crate) fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> [u8; 55] {
    let mut out = [b'-'; 55];
    out[0] = b'0';
    out[1] = b'0';
    let mut put = |at: usize, bytes: &[u8]| {
        for (i, byte) in bytes.iter().enumerate() {
            out[at + 2 * i] = HEX[usize::from(byte >> 4)];
            out[at + 2 * i + 1] = HEX[usize::from(byte & 0xf)];
        }
    };
    put(3, trace_id);
    put(36, span_id);
    put(53, &[u8::from(sampled)]);
    out
}

/// The most list members a `tracestate` keeps (W3C).
const MAX_LIST_MEMBERS: usize = 32;

/// The longest `tracestate` passed on; a longer one is cut down to it
/// (W3C: propagate at least 512 characters, and truncate beyond that).
const MAX_PASSED_ON: usize = 512;
/// The members a `tracestate` longer than [`MAX_PASSED_ON`] loses first
/// (W3C: those over 128 characters).
const LONG_MEMBER: usize = 128;

/// A client's `tracestate`, as passed on (upstream and in the exported
/// spans): its members, at most 32, blanks around them and empty ones
/// left out, joined by `,`; `None` if it has none or one is invalid (a
/// member without `=`, a key or value the W3C grammar refuses), as
/// OpenTelemetry's `TraceState` read and wrote it. Over 512 characters,
/// it is cut as W3C's truncation says: members over 128 characters go
/// first (the last of them first), then members from the end, each only
/// while it does not fit yet. So a client's header
/// costs each upstream request and span at most 512 bytes, not the 16 KB
/// that 32 members of 512 could take.
pub(crate) fn tracestate(value: &str) -> Option<Arc<str>> {
    let mut members: Vec<(&str, &str)> = Vec::new();
    for member in value.split_terminator(',').take(MAX_LIST_MEMBERS) {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let (key, value) = member.split_once('=')?;
        let value = value.trim_start_matches('=');
        if !valid_key(key) || !valid_value(value) {
            return None;
        }
        members.push((key, value));
    }
    let len = |m: &[(&str, &str)]| -> usize {
        m.iter().map(|(k, v)| k.len() + 1 + v.len()).sum::<usize>() + m.len().saturating_sub(1)
    };
    // Long members go first, from the end, only as many as needed; then
    // any from the end.
    while len(&members) > MAX_PASSED_ON {
        let long = members
            .iter()
            .rposition(|(k, v)| k.len() + 1 + v.len() > LONG_MEMBER);
        match long {
            Some(i) => members.remove(i),
            None => members.pop().unwrap_or_default(),
        };
    }
    let mut out = String::with_capacity(len(&members));
    for (key, value) in members {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(key);
        out.push('=');
        out.push_str(value);
    }
    (!out.is_empty()).then(|| Arc::from(out))
}

/// A `tracestate` key: lowercase letters, digits, `_-*/`, and at most one
/// `@` before a vendor of at most 13 characters starting with a letter or
/// digit; 256 characters at most.
fn valid_key(key: &str) -> bool {
    if key.len() > 256 {
        return false;
    }
    let special = |b: u8| matches!(b, b'_' | b'-' | b'*' | b'/');
    let mut vendor_start = None;
    for (i, &b) in key.as_bytes().iter().enumerate() {
        if !(b.is_ascii_lowercase() || b.is_ascii_digit() || special(b) || b == b'@') {
            return false;
        }
        if i == 0 && !b.is_ascii_lowercase() && !b.is_ascii_digit() {
            return false;
        } else if b == b'@' {
            if vendor_start.is_some() || i + 14 < key.len() {
                return false;
            }
            vendor_start = Some(i);
        } else if let Some(start) = vendor_start
            && i == start + 1
            && !(b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return false;
        }
    }
    true
}

/// A `tracestate` value: no `,` or `=`, 256 characters at most.
fn valid_value(value: &str) -> bool {
    value.len() <= 256 && !value.contains([',', '='])
}

/// Whether a new trace with `trace_id` is recorded at `ratio`: always at
/// 1 or more; else when the id's last 8 bytes (big-endian), shifted right
/// once, are below `ratio × 2⁶³` (OpenTelemetry's `TraceIdRatioBased`).
pub(crate) fn sampled_root(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1_u64 << 63) as f64) as u64;
    let mut low = [0_u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < bound
}

// Ids come from `rand`'s thread-local generator (ChaCha12, seeded and
// reseeded from the operating system): a cryptographic generator, so the
// ids a provider sees upstream do not reveal the next ids of this thread
// (other tenants' calls). It fills a buffer several blocks at a time, so
// an id costs a copy, not a keyed hash per 8 bytes.

/// A new trace id, never all zeros.
pub(crate) fn trace_id() -> [u8; 16] {
    let mut rng = rand::rng();
    let mut id = [0_u8; 16];
    while id == [0; 16] {
        rng.fill_bytes(&mut id);
    }
    id
}

/// A new span id, never all zeros.
pub(crate) fn span_id() -> [u8; 8] {
    let mut rng = rand::rng();
    loop {
        let id = rng.next_u64();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    fn trace_bytes() -> [u8; 16] {
        0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128.to_be_bytes()
    }

    fn span_bytes() -> [u8; 8] {
        0x00f0_67aa_0ba9_02b7_u64.to_be_bytes()
    }

    /// proves: OBS-5 (a client's valid `traceparent` is continued: its
    /// trace id, its span as the parent, its sampled flag; other flags
    /// are ignored; a later version is read from its first four fields)
    #[test]
    fn valid_traceparents_are_read() {
        let parent = |flags: &str| Parent {
            trace_id: trace_bytes(),
            span_id: span_bytes(),
            sampled: flags.ends_with(['1', '3', '9']),
        };
        for flags in ["00", "01", "03", "09", "02"] {
            let tp = format!("00-{TRACE}-{SPAN}-{flags}");
            assert_eq!(parse_traceparent(&tp), Some(parent(flags)), "{tp}");
        }
        // Blanks around the value (a header's optional white space).
        assert_eq!(
            parse_traceparent(&format!(" 00-{TRACE}-{SPAN}-01\t")),
            Some(parent("01"))
        );
        // A future version: parsed from its first 55 characters, the
        // rest after a dash ignored.
        for tp in [
            format!("01-{TRACE}-{SPAN}-01"),
            format!("02-{TRACE}-{SPAN}-09-XYZxsf09"),
            format!("cc-{TRACE}-{SPAN}-01-"),
        ] {
            assert_eq!(parse_traceparent(&tp), Some(parent("01")), "{tp}");
        }
        assert_eq!(
            parse_traceparent(&format!("fe-{TRACE}-{SPAN}-08-x")),
            Some(parent("08"))
        );
    }

    /// proves: OBS-5 (an invalid `traceparent` is not continued: the call
    /// starts a trace of its own)
    #[test]
    fn invalid_traceparents_are_refused() {
        let zero_trace = "0".repeat(32);
        let zero_span = "0".repeat(16);
        let upper_trace = TRACE.to_uppercase();
        let upper_span = "00F067AA0BA902B7";
        for (tp, why) in [
            (String::new(), "empty"),
            (format!("00-{TRACE}-{SPAN}"), "no flags"),
            (format!("00-{zero_trace}-{SPAN}-01"), "all-zero trace id"),
            (format!("00-{TRACE}-{zero_span}-01"), "all-zero span id"),
            (format!("00-{upper_trace}-{SPAN}-01"), "uppercase trace id"),
            (format!("00-{TRACE}-{upper_span}-01"), "uppercase span id"),
            (format!("00-{TRACE}-{SPAN}-0A"), "uppercase flags"),
            (format!("0A-{TRACE}-{SPAN}-01"), "uppercase version"),
            (format!("ff-{TRACE}-{SPAN}-01"), "version ff"),
            (format!("qw-{TRACE}-{SPAN}-01"), "bogus version"),
            (
                format!("00-{TRACE}-{SPAN}-01-"),
                "version 00 longer than 55",
            ),
            (
                format!("00-{TRACE}-{SPAN}-01x"),
                "version 00 longer than 55",
            ),
            (
                format!("01-{TRACE}-{SPAN}-01x"),
                "a later version not followed by -",
            ),
            (format!("00-ab{TRACE}-{SPAN}-01"), "trace id too long"),
            (
                format!("00-{}-{SPAN}-01", &TRACE[2..]),
                "trace id too short",
            ),
            (format!("00-{TRACE}-ab{SPAN}-01"), "span id too long"),
            (format!("00-{TRACE}-{SPAN}-0100"), "flags too long"),
            (format!("00-{}q-{SPAN}-01", &TRACE[1..]), "non-hex trace id"),
            (format!("00-{TRACE}-{}g-01", &SPAN[1..]), "non-hex span id"),
            (format!("00-{TRACE}-{SPAN}-0g"), "non-hex flags"),
            (format!("00_{TRACE}_{SPAN}_01"), "no dashes"),
            (format!("00-+{}-{SPAN}-01", &TRACE[1..]), "a sign"),
            (format!("00-{TRACE}-{SPAN}-é"), "not ASCII"),
        ] {
            assert_eq!(parse_traceparent(&tp), None, "{why}: {tp:?}");
        }
    }

    /// proves: OBS-5 (each attempt sends `traceparent` version 00 with its
    /// own span id and the sampled flag as recorded)
    #[test]
    fn traceparent_is_written_as_version_00() {
        let tp = traceparent(&trace_bytes(), &span_bytes(), true);
        assert_eq!(
            std::str::from_utf8(&tp).expect("ASCII"),
            format!("00-{TRACE}-{SPAN}-01")
        );
        let tp = traceparent(&[0xff; 16], &[0x0a; 8], false);
        assert_eq!(
            std::str::from_utf8(&tp).expect("ASCII"),
            format!("00-{}-{}-00", "f".repeat(32), "0a".repeat(8))
        );
        // What is written reads back.
        let id = trace_id();
        let span = span_id();
        let back =
            parse_traceparent(std::str::from_utf8(&traceparent(&id, &span, true)).expect("ASCII"));
        assert_eq!(
            back,
            Some(Parent {
                trace_id: id,
                span_id: span,
                sampled: true
            })
        );
    }

    /// proves: OBS-5 (a client's `tracestate` is passed on as
    /// OpenTelemetry's propagator passed it: members trimmed and joined,
    /// at most 32, dropped whole when one is invalid)
    #[test]
    fn tracestate_is_passed_on_as_before() {
        let ts = |s: &str| tracestate(s).map(|t| t.to_string());
        assert_eq!(ts("foo=bar").as_deref(), Some("foo=bar"));
        assert_eq!(
            ts("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7,").as_deref(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        assert_eq!(
            ts(" a=1 ,, \tb@vendor=2 ").as_deref(),
            Some("a=1,b@vendor=2")
        );
        assert_eq!(ts("a==1").as_deref(), Some("a=1"));
        assert_eq!(ts(""), None);
        assert_eq!(ts(" , "), None);
        for bad in [
            "novalue",
            "Upper=1",
            "a=1,b=2=3",
            "_a=1",
            "a@@b=1",
            "a@-b=1",
            "a@abcdefghijklmn=1",
        ] {
            assert_eq!(ts(bad), None, "{bad}");
        }
        let long = (0..40).map(|i| format!("k{i}=v")).collect::<Vec<_>>();
        let kept = ts(&long.join(",")).expect("kept");
        assert_eq!(kept, long[..32].join(","));
        // The same as OpenTelemetry's `TraceState` read and wrote them.
        let mut cases: Vec<String> = [
            "foo=bar",
            "a=1,b=2,",
            ",a=1",
            " a=1 , b=2",
            "a=1,,b=2",
            "a= 1",
            "a=1 ",
            "a=b=c",
            "a==b",
            "=a",
            "a=",
            "1a=x",
            "a@b_c=1",
            "t@vendor-1=x",
            "a@1=x",
            "a@b=x,a@b=y",
            "a/b*c_d-e=v",
            "a\u{7f}=1",
            "a=v\u{7f}",
            "x=é",
            "",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        cases.push(format!("k={}", "v".repeat(256)));
        cases.push(format!("k={}", "v".repeat(257)));
        cases.push(format!("{}=v", "k".repeat(257)));
        cases.push(long[..39].join(",") + ",Bad=1");
        for case in &cases {
            let sdk = case
                .parse::<opentelemetry::trace::TraceState>()
                .ok()
                .map(|t| t.header())
                .filter(|h| !h.is_empty());
            assert_eq!(ts(case), sdk, "{case:?}");
        }
    }

    /// proves: OBS-5 (a client's `tracestate` over 512 characters is cut
    /// as W3C says, members over 128 characters first, then from the end,
    /// so no call sends upstream or exports more than 512 bytes of it)
    #[test]
    fn a_long_tracestate_is_cut_to_512_characters() {
        let ts = |s: &str| tracestate(s).map(|t| t.to_string());
        // At the limit: passed on whole.
        let short: Vec<String> = (0..15)
            .map(|i| format!("k{i:02}={}", "v".repeat(27)))
            .collect();
        let exact = short.join(",");
        assert_eq!(exact.len(), 15 * 31 + 14);
        let at_limit = format!("{exact},z={}", "w".repeat(512 - exact.len() - 3));
        assert_eq!(at_limit.len(), 512);
        assert_eq!(ts(&at_limit).as_deref(), Some(at_limit.as_str()));
        // One member over 128 goes first, even though it comes first.
        let long = format!("big={}", "x".repeat(200));
        let over = format!("{long},{exact}");
        assert!(over.len() > 512);
        assert_eq!(ts(&over).as_deref(), Some(exact.as_str()));
        // Two long members, one enough: only the later goes.
        let first = format!("one={}", "x".repeat(196));
        let second = format!("two={}", "y".repeat(196));
        let shorts = short[..8].join(",");
        let both = format!("{first},{shorts},{second}");
        assert!(both.len() > 512 && first.len() + 1 + shorts.len() <= 512);
        assert_eq!(ts(&both), Some(format!("{first},{shorts}")));
        // All short: members from the end go until it fits.
        let many: Vec<String> = (0..32)
            .map(|i| format!("k{i:02}={}", "v".repeat(27)))
            .collect();
        let kept = ts(&many.join(",")).expect("kept");
        assert_eq!(
            kept,
            many[..16].join(","),
            "16 members of 31 and 15 commas: 511"
        );
        // The largest a client can send (32 members of 256 + 1 + 256): at
        // most 512 left, here nothing (every member is long).
        let huge: Vec<String> = (0..32)
            .map(|i| format!("{}{i:02}={}", "k".repeat(254), "v".repeat(256)))
            .collect();
        assert_eq!(ts(&huge.join(",")), None);
        for case in [&at_limit, &over, &many.join(",")] {
            assert!(ts(case).is_some_and(|t| t.len() <= 512), "{case}");
        }
    }

    /// proves: OBS-5 (sampling is OpenTelemetry's
    /// `ParentBased(TraceIdRatioBased(ratio))` for new traces: ratio 1
    /// records all, 0 none, between by the trace id's low bits)
    #[test]
    fn root_sampling_follows_the_trace_id_ratio_rule() {
        let id = |low: u64| {
            let mut t = [0x11_u8; 16];
            t[8..].copy_from_slice(&low.to_be_bytes());
            t
        };
        for low in [0, 1, u64::MAX / 2, u64::MAX] {
            assert!(sampled_root(1.0, &id(low)));
            assert!(sampled_root(1.5, &id(low)));
            assert!(!sampled_root(0.0, &id(low)), "{low}");
            assert!(!sampled_root(-1.0, &id(low)), "{low}");
        }
        // 0.5: bound 2^62; low >> 1 < 2^62 means low < 2^63.
        assert!(sampled_root(0.5, &id((1 << 63) - 1)));
        assert!(!sampled_root(0.5, &id(1 << 63)));
        // The high bytes play no part.
        let mut high = id(0);
        high[..8].copy_from_slice(&[0xff; 8]);
        assert!(sampled_root(0.01, &high));
        // About the ratio of random ids.
        let n = 20_000;
        let kept = (0..n).filter(|_| sampled_root(0.25, &trace_id())).count();
        assert!((4_000..6_000).contains(&kept), "{kept} of {n}");
    }

    /// proves: OBS-5 (new ids are never all zeros and do not repeat)
    #[test]
    fn ids_are_random_and_non_zero() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert_ne!(trace_id(), [0; 16]);
            let s = span_id();
            assert_ne!(s, [0; 8]);
            assert!(seen.insert(s));
        }
        let other = std::thread::spawn(span_id).join().expect("thread");
        assert!(!seen.contains(&other));
    }
}
