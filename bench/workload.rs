//! The shared, deterministic benchmark workload: realistic BabelQueue envelopes as
//! JSON lines, with a share of byte-identical redeliveries.
//!
//! Included by path from `bench/throughput.rs`, `examples/gen_workload.rs` and
//! `examples/memory_per_id.rs`, so all three see the exact same bytes. No new
//! dependency: the PRNG is a hand-rolled splitmix64 with a fixed seed.
//!
//! (Cargo also discovers this file as a bench target of its own; built that way it
//! is an empty libtest bench that runs 0 benchmarks.)
#![allow(dead_code)]

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;

/// Seed of the envelope contents.
pub const SEED: u64 = 0xB0B0_BABE_1D3E_0001;
/// Seed of the redelivery schedule (which lines repeat, and how far later).
pub const SCHEDULE_SEED: u64 = 0xB0B0_BABE_1D3E_0002;
/// Lines in the default workload.
pub const DEFAULT_LINES: usize = 1_000_000;
/// Share of lines that are redeliveries (byte-identical copies of an earlier line).
pub const REDELIVERY_PERCENT: usize = 20;
/// A redelivery lands 1..=this many first deliveries after its original (about
/// 1.25x that in lines, since redeliveries are interleaved too).
pub const MAX_REDELIVERY_GAP: u64 = 200;

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough for test data.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough value in `0..n` (multiply-shift; the bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// 16 random bytes with the UUID version 4 and RFC 4122 variant bits set.
    pub fn uuid_v4_bytes(&mut self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        b[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        b
    }

    /// A random canonical lowercase UUID v4 string (the usual `meta.id`).
    pub fn uuid_v4(&mut self) -> String {
        format_uuid(&self.uuid_v4_bytes(), false)
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower or upper case hex.
pub fn format_uuid(b: &[u8; 16], upper: bool) -> String {
    let hex: &[u8; 16] = if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(hex[usize::from(byte >> 4)] as char);
        s.push(hex[usize::from(byte & 15)] as char);
    }
    s
}

const JOBS: &[(&str, &str)] = &[
    ("urn:babel:orders:created", "orders"),
    ("urn:babel:orders:paid", "orders"),
    ("urn:babel:orders:shipped", "fulfilment"),
    ("urn:babel:orders:refunded", "payments"),
];
const LANGS: &[&str] = &["php", "python", "node", "go", "java", "rust"];
const CURRENCIES: &[&str] = &["EUR", "USD", "GBP", "JPY", "CHF"];
/// `created_at` of the first envelope (the fixture's), in ms since the Unix epoch.
const BASE_CREATED_AT_MS: u64 = 1_749_132_727_000;

/// One first delivery, shaped like `tests/conformance/fixtures/order-created.json`
/// (compact, one line, about 300 bytes).
fn envelope(rng: &mut SplitMix64, seq: u64) -> String {
    let id = rng.uuid_v4();
    let trace_id = rng.uuid_v4();
    let &(job, queue) = rng.pick(JOBS);
    let lang = rng.pick(LANGS);
    let currency = rng.pick(CURRENCIES);
    let cents = 500 + rng.below(99_500);
    let customer = rng.below(1_000_000);
    let created_at = BASE_CREATED_AT_MS + seq * 40 + rng.below(40);
    let mut s = String::with_capacity(336);
    let _ = write!(
        s,
        concat!(
            r#"{{"job":"{job}","trace_id":"{trace_id}","data":{{"order_id":{order_id},"#,
            r#""amount":{units}.{cents:02},"currency":"{currency}","customer":"cus_{customer:06}"}},"#,
            r#""meta":{{"id":"{id}","queue":"{queue}","lang":"{lang}","schema_version":1,"#,
            r#""created_at":{created_at}}},"attempts":0}}"#,
        ),
        job = job,
        trace_id = trace_id,
        order_id = 1_000_000 + seq,
        units = cents / 100,
        cents = cents % 100,
        currency = currency,
        customer = customer,
        id = id,
        queue = queue,
        lang = lang,
        created_at = created_at,
    );
    s
}

/// The workload: `n` lines (no trailing newline), of which `n * 20 / 100` are
/// byte-identical copies of an earlier line placed a short random distance later,
/// each original repeated at most once. Same `n`, same bytes, every time.
pub fn generate(n: usize) -> Vec<String> {
    let redeliveries = n * REDELIVERY_PERCENT / 100;
    let originals = n - redeliveries;
    let mut content = SplitMix64::new(SEED);
    let mut schedule = SplitMix64::new(SCHEDULE_SEED);

    let first: Vec<String> = (0..originals as u64)
        .map(|seq| envelope(&mut content, seq))
        .collect();

    // Pick exactly `redeliveries` originals (selection sampling, Knuth's
    // Algorithm S), each to be repeated after original `min(i + gap, last)`.
    let mut repeats: Vec<(usize, usize)> = Vec::with_capacity(redeliveries);
    for i in 0..originals {
        let still_needed = (redeliveries - repeats.len()) as u64;
        if schedule.below((originals - i) as u64) < still_needed {
            let gap = 1 + schedule.below(MAX_REDELIVERY_GAP) as usize;
            repeats.push(((i + gap).min(originals - 1), i));
        }
    }
    repeats.sort_unstable();

    let mut lines = Vec::with_capacity(n);
    let mut next = repeats.iter().peekable();
    for (j, line) in first.iter().enumerate() {
        lines.push(line.clone());
        while let Some(&(_, i)) = next.next_if(|&&(after, _)| after == j) {
            lines.push(first[i].clone());
        }
    }
    debug_assert_eq!(lines.len(), n);
    lines
}

#[derive(serde::Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow)]
    meta: MetaIdOnly<'a>,
}

#[derive(serde::Deserialize)]
struct MetaIdOnly<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
}

/// Distinct `meta.id`s, read back from the lines themselves with serde (independent
/// of how [`generate`] built them). Panics on a line without a string `meta.id`.
pub fn count_distinct_ids<S: AsRef<str>>(lines: &[S]) -> usize {
    let mut ids: HashSet<Cow<'_, str>> = HashSet::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        let parsed: IdOnly = serde_json::from_str(line.as_ref())
            .unwrap_or_else(|e| panic!("workload line {n} has no string meta.id: {e}"));
        ids.insert(parsed.meta.id);
    }
    ids.len()
}
