//! Stage A's reading of a consumed record's headers, which any producer controls: decided before
//! anything else, through the librdkafka C API, never through rust-rdkafka's `Headers` (which
//! cannot tell "no headers" from "headers librdkafka cannot parse", and whose names are `&str`).
//!
//! A record's headers travel through the pipeline only if
//! - librdkafka can parse them: it refuses a consumed record with more than 100,000
//!   (`rd_kafka_msg_headers_parse`, `__BAD_MSG`), and rust-rdkafka then reports none;
//! - there are at most [`MAX_HEADERS`];
//! - every name is UTF-8 (names are bytes on the wire; rust-rdkafka's API and hookline's
//!   records hold them as `&str`).
//!
//! Otherwise the record is quarantined as `bad_headers` with a [`BadHeaders`] detail naming the
//! problem, its key and value whole and none of its headers (see `validate.rs`).
//!
//! Not detectable here: a name with a NUL byte inside. librdkafka hands names out as C strings,
//! so such a name reads (and travels) cut at its first NUL.

use std::ffi::CStr;
use std::ptr;

use rdkafka::bindings as rdsys;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;

use hookline_common::kafka::recordsize::HEADER_OVERHEAD;

/// Most headers a record may carry into the pipeline (all of them, `hookline-…` included).
///
/// Why 1,000: librdkafka parses at most 100,000 headers of a consumed record, and hookline adds
/// its own on the way (3–4 event headers on `<p>.dedupe`, then the delivery headers, or 5–8
/// quarantine headers): a record near librdkafka's limit would be read as having none further
/// down (an event then lost as malformed). A limit far below that leaves room for anything
/// hookline adds, while real producers (tracing, content type, a few application headers) stay
/// far under it; it also bounds the per-record work of copying headers at every hop.
pub const MAX_HEADERS: usize = 1_000;

/// A header as it travels: its (UTF-8) name and its value.
pub type Header = (String, Option<Vec<u8>>);

/// Why a record's headers cannot travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadHeaders {
    /// The `hookline-invalid-detail`, e.g. "1,001 headers, over the limit of 1,000".
    pub detail: String,
    /// What the original headers count against a size limit (names, values, framing), when
    /// librdkafka could read them: `hookline-original-headers-bytes` of the quarantine copy.
    pub bytes: Option<usize>,
}

/// Every header of a consumed record, in order, or why they cannot travel.
pub fn read(msg: &BorrowedMessage<'_>) -> Result<Vec<Header>, BadHeaders> {
    let mut hdrs: *mut rdsys::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: `msg.ptr()` is the live consumed message; librdkafka parses its headers once and
    // keeps them with the message, so `hdrs` is valid as long as `msg` is.
    let err = unsafe { rdsys::rd_kafka_message_headers(msg.ptr(), &mut hdrs) };
    match RDKafkaErrorCode::from(err) {
        RDKafkaErrorCode::NoError if !hdrs.is_null() => {
            // SAFETY: `hdrs` is the message's live headers list (above).
            unsafe { read_native(hdrs) }
        }
        RDKafkaErrorCode::NoError | RDKafkaErrorCode::NoEnt => Ok(Vec::new()),
        code => Err(BadHeaders {
            detail: format!(
                "librdkafka cannot parse the headers ({code}): more than 100,000, or malformed"
            ),
            bytes: None,
        }),
    }
}

/// Reads a librdkafka headers list.
///
/// # Safety
/// `hdrs` must point to a live `rd_kafka_headers_t` that outlives this call.
unsafe fn read_native(hdrs: *const rdsys::rd_kafka_headers_t) -> Result<Vec<Header>, BadHeaders> {
    let count = rdsys::rd_kafka_header_cnt(hdrs);
    decide(count, |idx| {
        let (mut name, mut value, mut size) = (ptr::null(), ptr::null(), 0);
        let err = rdsys::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size);
        if RDKafkaErrorCode::from(err) != RDKafkaErrorCode::NoError || name.is_null() {
            return None;
        }
        let name = CStr::from_ptr(name).to_bytes();
        let value =
            (!value.is_null()).then(|| std::slice::from_raw_parts(value.cast::<u8>(), size));
        Some((name, value))
    })
}

/// The decision on `count` headers, header `i` being `get(i)` (`None`: unreadable).
fn decide<'a>(
    count: usize,
    get: impl Fn(usize) -> Option<(&'a [u8], Option<&'a [u8]>)>,
) -> Result<Vec<Header>, BadHeaders> {
    let bytes = || {
        (0..count)
            .filter_map(&get)
            .map(|(n, v)| n.len() + v.map_or(0, <[u8]>::len) + HEADER_OVERHEAD)
            .sum::<usize>()
    };
    if count > MAX_HEADERS {
        return Err(BadHeaders {
            detail: format!(
                "{} headers, over the limit of {}",
                thousands(count),
                thousands(MAX_HEADERS)
            ),
            bytes: Some(bytes()),
        });
    }
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let problem = match get(idx) {
            None => "librdkafka cannot read it".to_string(),
            Some((name, value)) => match std::str::from_utf8(name) {
                Ok(name) => {
                    out.push((name.to_string(), value.map(<[u8]>::to_vec)));
                    continue;
                }
                Err(_) => format!("its name is not UTF-8 (\"{}\")", shown(name)),
            },
        };
        return Err(BadHeaders {
            detail: format!("header {} of {count}: {problem}", idx + 1),
            bytes: Some(bytes()),
        });
    }
    Ok(out)
}

/// At most 64 bytes of a name, escaped (`x-\xff\xfe`), for the detail.
fn shown(name: &[u8]) -> String {
    const SHOWN: usize = 64;
    let mut out = name[..name.len().min(SHOWN)].escape_ascii().to_string();
    if name.len() > SHOWN {
        out.push('…');
    }
    out
}

/// `n` with thousands separators: 100001 → "100,001".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header as RdHeader, Headers, OwnedHeaders};

    /// `pairs` as a librdkafka headers list; names are raw bytes (added with the C API, as a
    /// producer outside Rust may).
    fn native(pairs: &[(&[u8], Option<&[u8]>)]) -> OwnedHeaders {
        let headers = OwnedHeaders::new_with_capacity(pairs.len());
        let raw = raw(&headers).cast_mut();
        for (name, value) in pairs {
            let (value_ptr, value_len) = match value {
                Some(v) => (v.as_ptr().cast(), v.len() as isize),
                None => (ptr::null(), -1),
            };
            // SAFETY: `raw` is the list `headers` owns; librdkafka copies name and value.
            let err = unsafe {
                rdsys::rd_kafka_header_add(
                    raw,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    value_ptr,
                    value_len,
                )
            };
            assert_eq!(RDKafkaErrorCode::from(err), RDKafkaErrorCode::NoError);
        }
        headers
    }

    fn raw(headers: &OwnedHeaders) -> *const rdsys::rd_kafka_headers_t {
        headers.as_borrowed() as *const rdkafka::message::BorrowedHeaders
            as *const rdsys::rd_kafka_headers_t
    }

    fn read_owned(headers: &OwnedHeaders) -> Result<Vec<Header>, BadHeaders> {
        // SAFETY: `headers` is alive for the call.
        unsafe { read_native(raw(headers)) }
    }

    #[test]
    fn headers_are_read_in_order_with_null_values() {
        let h = native(&[
            (b"x-trace", Some(b"t1")),
            (b"x-null", None),
            (b"x-empty", Some(b"")),
        ]);
        assert_eq!(
            read_owned(&h),
            Ok(vec![
                ("x-trace".to_string(), Some(b"t1".to_vec())),
                ("x-null".to_string(), None),
                ("x-empty".to_string(), Some(Vec::new())),
            ])
        );
        assert_eq!(read_owned(&native(&[])), Ok(Vec::new()));
    }

    #[test]
    fn a_name_that_is_not_utf8_is_named_with_its_position() {
        let h = native(&[
            (b"a", Some(b"1")),
            (b"b", Some(b"22")),
            (b"x-\xff\xfe", Some(b"v")),
            (b"d", None),
        ]);
        let bad = read_owned(&h).unwrap_err();
        assert_eq!(
            bad.detail,
            r#"header 3 of 4: its name is not UTF-8 ("x-\xff\xfe")"#
        );
        assert_eq!(bad.bytes, Some(2 + 3 + 5 + 1 + 4 * HEADER_OVERHEAD));
    }

    #[test]
    fn the_limit_is_inclusive() {
        let names: Vec<String> = (0..=MAX_HEADERS).map(|i| format!("h{i}")).collect();
        let pairs: Vec<(&[u8], Option<&[u8]>)> = names
            .iter()
            .map(|n| (n.as_bytes(), Some(&b"v"[..])))
            .collect();
        let at = read_owned(&native(&pairs[..MAX_HEADERS])).expect("at the limit");
        assert_eq!(at.len(), MAX_HEADERS);
        let over = read_owned(&native(&pairs)).unwrap_err();
        assert_eq!(over.detail, "1,001 headers, over the limit of 1,000");
        let expected: usize = names.iter().map(|n| n.len() + 1 + HEADER_OVERHEAD).sum();
        assert_eq!(over.bytes, Some(expected));
    }

    #[test]
    fn an_unreadable_header_is_bad() {
        let bad = decide(2, |i| (i == 0).then_some((&b"a"[..], None))).unwrap_err();
        assert_eq!(bad.detail, "header 2 of 2: librdkafka cannot read it");
    }

    #[test]
    fn a_long_bad_name_is_shown_cut() {
        let name = [b'\xff'; 100];
        let bad = decide(1, |_| Some((&name[..], None))).unwrap_err();
        assert!(bad.detail.ends_with("\\xff…\")"), "{}", bad.detail);
        assert_eq!(bad.detail.matches("\\xff").count(), 64);
    }

    #[test]
    fn thousands_separators() {
        for (n, s) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1,000"),
            (100_001, "100,001"),
            (1_234_567, "1,234,567"),
        ] {
            assert_eq!(thousands(n), s);
        }
    }

    /// Defence in depth (`vendor/rdkafka/PATCHED.md`, change 2): rust-rdkafka's own iteration
    /// reads a name that is not UTF-8 as U+FFFD instead of panicking.
    #[test]
    fn the_patched_rdkafka_does_not_panic_on_a_name_that_is_not_utf8() {
        let h = native(&[(b"ok", Some(b"1")), (b"x-\xff\xfe", Some(b"v"))]);
        let names: Vec<&str> = h.as_borrowed().iter().map(|hd| hd.key).collect();
        assert_eq!(names, ["ok", "\u{FFFD}"]);
        let _: Vec<RdHeader<'_, &[u8]>> = h.iter().collect();
    }
}
